from __future__ import annotations

import sys

from stampd.cli import main

sys.exit(main())
