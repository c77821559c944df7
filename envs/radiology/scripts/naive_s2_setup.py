"""The naive baseline's S2: write its pipeline (``SLOT_PIPELINE``), nothing recorded."""

import os
os.makedirs('pipeline', exist_ok=True)
open('pipeline/infer.py', 'w').write(SLOT_PIPELINE)
