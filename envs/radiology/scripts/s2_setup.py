"""S2: record the environment and write the pipeline (``SLOT_PIPELINE``, its text)."""

import json, os, platform, numpy, pydicom
os.makedirs('setup', exist_ok=True)
json.dump({'python': platform.python_version(), 'numpy': numpy.__version__, 'pydicom': pydicom.__version__}, open('setup/environment.json', 'w'), indent=2)
os.makedirs('pipeline', exist_ok=True)
open('pipeline/infer.py', 'w').write(SLOT_PIPELINE)
print('pipeline written')
