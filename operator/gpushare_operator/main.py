"""`gpushare-operator`: the packaged entry point (what the Deployment runs).

Flags are the environment variables of `gpushare_operator.config` by another name; an
explicit flag wins over the environment. The operator then runs under kopf, cluster-wide
and standalone (every replica watches; the Lease decides who binds).
"""

from __future__ import annotations

import argparse
import os
import sys

import kopf

from gpushare_operator.config import ConfigError, from_env

_FLAGS = {
    "--scheduler-names": "GPUSHARE_SCHEDULER_NAMES",
    "--policy": "GPUSHARE_POLICY",
    "--assignment-timeout": "GPUSHARE_ASSIGNMENT_TIMEOUT",
    "--bind-timeout": "GPUSHARE_BIND_TIMEOUT",
    "--leader-elect": "GPUSHARE_LEADER_ELECT",
    "--lease-namespace": "GPUSHARE_LEASE_NAMESPACE",
    "--lease-name": "GPUSHARE_LEASE_NAME",
    "--lease-duration": "GPUSHARE_LEASE_DURATION",
    "--identity": "GPUSHARE_IDENTITY",
    "--metrics-port": "GPUSHARE_METRICS_PORT",
    "--log-level": "GPUSHARE_LOG_LEVEL",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare-operator", description=__doc__)
    for flag, variable in _FLAGS.items():
        parser.add_argument(flag, dest=variable, help=f"overrides ${variable}")
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="kopf liveness endpoint (empty to disable)",
    )
    args = parser.parse_args(argv)
    for variable, value in vars(args).items():
        if variable.startswith("GPUSHARE_") and value is not None:
            os.environ[variable] = value
    try:
        from_env()  # refuse a bad configuration before connecting anywhere
    except ConfigError as error:
        print(f"gpushare-operator: {error}", file=sys.stderr)
        return 2
    from gpushare_operator import handlers  # noqa: F401, PLC0415  (importing registers them)

    kopf.run(clusterwide=True, standalone=True, liveness_endpoint=args.liveness or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
