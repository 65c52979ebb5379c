"""Pulumi entry point for the out-of-band telemetry stack; all logic lives in infra.program."""

import sys
from pathlib import Path

# `pulumi up` runs this file from infra/; make the repo root importable so `infra.*` resolves.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.program import main

main()
