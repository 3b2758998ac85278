"""``python -m store.sql [--write]``: check (or rewrite) the committed SQL of every named
statement, ``store/sql/<dialect>.sql``; exits 1 when a file is stale."""

from store.catalogue import main

raise SystemExit(main())
