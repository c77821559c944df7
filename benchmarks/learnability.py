"""Does a staged benchmark teach? The paper's comparison with a tiny local model, as a study.

A thin caller of :mod:`bat_gym.trainers.study` (the same as ``bat-gym study run``):
Baseline, SFT, GRPO E2E-only, BiCuRL with the three-pool mix and its three
drop-one-pool arms, several seeds each, every RL arm from one SFT checkpoint at one
generated-token budget; held-out evaluation with tracks as units and bootstrap CIs.
Everything is built on the spot (a Stage Bank, a byte-level BPE tokenizer, a random-init
Qwen3-style model); nothing is downloaded. Each arm x seed is a cached unit, so a rerun
into the same ``--out`` resumes.

    python benchmarks/learnability.py --quick          # the short version
    python benchmarks/learnability.py --out runs/learn # the full version (hours; resumable)

``--study`` takes another study file (default: ``benchmarks/studies/skill_ladder.yaml``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bat_gym.trainers.study.cli import run

STUDY = Path(__file__).with_name("studies") / "skill_ladder.yaml"


def main(argv: list[str] | None = None) -> None:
    """Parse flags, run (or resume) the study, print where its table is."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", type=Path, default=STUDY, help="the study's YAML file")
    p.add_argument("--quick", action="store_true", help="the file's quick: sizes")
    p.add_argument("--out", type=Path, help="study folder; a rerun resumes it")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = p.parse_args(argv)
    out = run(args.study, quick=args.quick, out=args.out, threads=args.threads)
    sys.stdout.write((out / "results.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
