import sys

from kubetune_cli.main import main

sys.exit(main())
