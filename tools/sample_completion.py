"""Greedy completion of held-out Python source (stdlib json/tool.py, not in the training set)
by the shipped default target: `python tools/sample_completion.py [--tokens N]`."""

from __future__ import annotations

import argparse
import pathlib
import sysconfig

import jaxspec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="default")
    p.add_argument("--tokens", type=int, default=80)
    a = p.parse_args(argv)
    src = (pathlib.Path(sysconfig.get_paths()["stdlib"]) / "json" / "tool.py").read_text()
    prompt = src[src.index("def main():") :][:200]
    model = jaxspec.load(a.checkpoint)
    ids = model.tokenizer.encode(prompt, add_special_tokens=False)
    out = jaxspec.generate(model, ids, a.tokens, temperature=0.0)
    print(prompt + model.tokenizer.decode(out.tokens))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
