import sys

from tfrepro.cli import main

sys.exit(main())
