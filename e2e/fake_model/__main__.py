"""``python -m e2e.fake_model``: the fake model server's entry point."""

from e2e.fake_model.cli import main

raise SystemExit(main())
