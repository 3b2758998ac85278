"""The run-job wing: the ``run-job`` flow and the stage engine it drives each subject through
(register and claim, collect, transform, persist with its outbox rows), the ``revise`` flow that
reruns one Run through the same engine, and what only they use: the tick's context and
outcomes, the lease keeper, stop handling, stale ticks and the per-tick monitoring."""
