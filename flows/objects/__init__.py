"""The object-storage channel: a job's report written once to an S3-compatible bucket through a
``prefect-aws`` S3Bucket block, with a conditional write (``If-None-Match: *``) so that the store
itself refuses a second object under the same key. Exports the channel's definition."""

from flows.objects.channel import CHANNEL

__all__ = ["CHANNEL"]
