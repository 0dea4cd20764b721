from remote.cli import main

raise SystemExit(main())
