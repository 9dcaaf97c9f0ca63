"""`gpushare-operator`: the packaged entry point (what the Deployment runs).

Each option of `gpushare_operator.config.OPTIONS` is a flag and an environment variable; an
explicit flag wins over the environment. The configuration is read once, here, and handed to
kopf's startup handler in its memo; the operator then runs under kopf, cluster-wide and
standalone (every replica watches; the Lease decides who binds).
"""

from __future__ import annotations

import argparse
import os
import sys

import kopf

from gpushare import logs
from gpushare_operator.config import ConfigError, add_flags, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare-operator", description=__doc__)
    add_flags(parser)
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf liveness endpoint (empty to disable)",
    )
    args = parser.parse_args(argv)
    try:
        config = load(vars(args), os.environ)  # refused before connecting anywhere
    except ConfigError as error:
        print(f"gpushare-operator: {error}", file=sys.stderr)
        return 2
    logs.configure(config.log_level)  # kopf's own lines before the startup handler, too
    from gpushare_operator import handlers  # noqa: PLC0415  (importing registers them)

    kopf.run(
        clusterwide=True,
        standalone=True,
        liveness_endpoint=args.liveness or None,
        memo=handlers.kopf_memo(config),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
