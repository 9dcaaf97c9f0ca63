import sys

from gpushare_plugin.main import main

sys.exit(main())
