import sys

from gpushare_cli.main import main

sys.exit(main())
