import sys

from tfrepro.cli.commands import main

sys.exit(main())
