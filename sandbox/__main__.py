from hermes_sandbox.cli import main

raise SystemExit(main())
