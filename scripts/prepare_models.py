"""Build the tiny test models and convert the embedded SmolLM2 model into the cache ahead of time.

Useful on a cluster before launching many ranks (they then only read the cache), or to warm a CI cache:
    python scripts/prepare_models.py [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", help="cache folder (default: $LOGIT_READOUT_CACHE or ~/.cache/logit-readout)")
    ap.add_argument("--skip-embedded", action="store_true", help="only build the tiny models")
    args = ap.parse_args()
    if args.cache:
        os.environ["LOGIT_READOUT_CACHE"] = args.cache
    from engine import embedded, tiny

    for alias in tiny.FAMILIES:
        t0 = time.perf_counter()
        path = tiny.ensure_tiny(alias)
        print(f"{alias:12s} {path}  ({time.perf_counter() - t0:.1f} s)")
    if not args.skip_embedded:
        t0 = time.perf_counter()
        path = embedded.ensure_smollm2()
        print(f"smollm2-135m {path}  ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
