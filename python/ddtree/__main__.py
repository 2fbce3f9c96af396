"""``python -m ddtree <command>``: the project's command-line tools.

Each subcommand lives in its own module, which supplies ``add_arguments(parser)`` and
``run(args) -> int``; adding a command is one more entry in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys

from . import bench
from .demo import cli as demo

# name -> (module, one-line help). The module is imported eagerly: every command is cheap to
# import (torch is already a dependency of the package itself).
COMMANDS = {
    "demo": (
        demo,
        "decode SmolLM2-135M three ways (greedy, chain, DDTree) with ddtree's build, tree "
        "attention, accept and KV commit (CPU by default; --device cuda)",
    ),
    "bench": (
        bench,
        "time a round per stage: the reference vs the Rust CPU path; --device cuda: the GPU "
        "build; --loop: a GPU decode loop; --attention: the GPU tree verify attention; --host: "
        "host time per Stepper call",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ddtree", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=module.__doc__)
        # A command's own formatter (the benchmarks' shows each flag's default), else the
        # description's line breaks kept.
        p.formatter_class = getattr(module, "HelpFormatter", argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"] and "--loop" in argv:  # the loop has its own flags
        from . import bench_loop

        return bench_loop.main([a for a in argv[1:] if a != "--loop"])
    if argv[:1] == ["bench"] and "--attention" in argv:  # so has the attention benchmark
        from . import bench_attention

        return bench_attention.main([a for a in argv[1:] if a != "--attention"])
    if argv[:1] == ["bench"] and "--host" in argv:  # and the host-cost benchmark
        from . import bench_host

        return bench_host.main([a for a in argv[1:] if a != "--host"])
    if argv[:1] == ["bench"] and "--vocab-parallel" in argv:  # and the vocab-parallel build
        from . import bench_vocab_parallel

        return bench_vocab_parallel.main([a for a in argv[1:] if a != "--vocab-parallel"])
    if argv[:1] == ["bench"] and _cuda_device(argv):  # and the GPU build's sweep
        from . import bench_gpu

        return bench_gpu.main(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = list(argv)  # the benchmark prints the exact command line it ran
    return args.run(args)


def _cuda_device(argv: list[str]) -> bool:
    """Whether ``argv`` asks for ``--device cuda[:N]`` (its flags, e.g. ``--bs 1 8 64``,
    are not the CPU benchmark's)."""
    for flag, value in zip(argv, argv[1:] + [""], strict=True):
        if flag.startswith("--device="):
            flag, value = "--device", flag.split("=", 1)[1]
        if flag == "--device" and value.startswith("cuda"):
            return True
    return False


if __name__ == "__main__":
    raise SystemExit(main())
