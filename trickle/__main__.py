from trickle.cli import main

raise SystemExit(main())
