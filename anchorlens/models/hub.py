"""Hub ids (``ORG/NAME`` or ``ORG/NAME@REVISION``) resolved through huggingface_hub and the standard HF cache.

``HF_HOME``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` are honoured by huggingface_hub itself (read from
its ``constants`` module at call time). Only safetensors weights, JSON configs and tokenizer files
are ever fetched; pickles and code never are.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from anchorlens.atomic import os_errors
from anchorlens.errors import UsageError

ALLOW_PATTERNS = ["*.safetensors", "*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja", "tokenizer*"]
IGNORE_PATTERNS = ["*/*", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.py", "*.h5", "*.msgpack", "*.onnx", "*.gguf"]
_SHORT_HASH = re.compile(r"[0-9a-f]{7,39}")
_REQUIRED = {"model": "config.json", "adapter": "adapter_config.json"}
_WHAT = {"model": "a model", "adapter": "a PEFT adapter"}


@dataclass(frozen=True)
class HubId:
    """A parsed hub id: repository and optional revision (branch, tag or commit)."""

    repo_id: str
    revision: str | None

    def download_command(self) -> str:
        """The ``hf download`` command that fetches this id."""
        return f"hf download {self.repo_id}" + (f" --revision {self.revision}" if self.revision else "")


def parse_hub_id(spec: str) -> HubId | None:
    """``"ORG/NAME@REV"`` -> HubId; None when ``spec`` is not shaped like a hub id (e.g. a path)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    name, at, revision = spec.partition("@")
    if name.count("/") != 1:
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    if at and not revision:
        raise UsageError(f"{spec!r} names no revision after '@'; write ORG/NAME@REVISION (a branch, tag or commit)")
    return HubId(name, revision or None)


def is_hub_id(spec: str) -> bool:
    """Whether ``spec`` is shaped like ``ORG/NAME[@REVISION]`` (it may still not exist)."""
    try:
        return parse_hub_id(spec) is not None
    except UsageError:
        return True


def hub_cache_dir() -> Path:
    """The HuggingFace hub cache huggingface_hub uses now (``HF_HUB_CACHE`` or ``HF_HOME/hub``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def _expand_short_hash(hub: HubId, cache: Path) -> str | None:
    """A cached snapshot's full commit hash starting with a short ``hub.revision`` (unique), else None."""
    if hub.revision is None or not _SHORT_HASH.fullmatch(hub.revision):
        return None
    from huggingface_hub.file_download import repo_folder_name

    snapshots = cache / repo_folder_name(repo_id=hub.repo_id, repo_type="model") / "snapshots"
    try:
        found = [p.name for p in snapshots.iterdir() if p.name.startswith(hub.revision)]
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


def _display(hub: HubId) -> str:
    return hub.repo_id + (f"@{hub.revision}" if hub.revision else "")


@contextmanager
def _hub_errors(hub: HubId, cache: Path, offline: bool, kind: str = "model") -> Iterator[None]:
    """huggingface_hub's errors (not cached offline, not found, gated, unwritable cache) as one-line UsageErrors."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = _display(hub)
    try:
        yield
    except IncompleteSnapshotError as err:
        missing = str(err).split(" is incomplete: ", 1)[-1].split(".", 1)[0]
        how = "and HF_HUB_OFFLINE=1" if offline else "and the Hub could not be reached"
        raise UsageError(
            f"{name} is only partly in the HuggingFace cache at {cache} ({missing}) {how}; "
            f"complete it with `{hub.download_command()}`" + (" (or unset HF_HUB_OFFLINE)" if offline else "")
        ) from None
    except LocalEntryNotFoundError as err:
        if offline:
            raise UsageError(
                f"{name} is not in the HuggingFace cache at {cache} and HF_HUB_OFFLINE=1; "
                f"fetch it with `{hub.download_command()}` (or unset HF_HUB_OFFLINE)"
            ) from None
        cause = err.__cause__
        why = f"{type(cause).__name__}: {str(cause).splitlines()[0]}" if cause else "no connection"
        raise UsageError(
            f"{name} is not in the HuggingFace cache at {cache} and the Hub could not be reached ({why}); "
            f"check the connection or fetch it with `{hub.download_command()}`"
        ) from None
    except GatedRepoError:
        raise UsageError(
            f"{hub.repo_id} is gated on the HuggingFace Hub; accept its terms on huggingface.co and log in with `hf auth login`"
        ) from None
    except RepositoryNotFoundError:
        raise UsageError(
            f"{hub.repo_id} was not found on the HuggingFace Hub (or it is private: log in with `hf auth login`); "
            "check the id, or give a local directory"
        ) from None
    except RevisionNotFoundError:
        raise UsageError(
            f"revision {hub.revision!r} of {hub.repo_id} does not exist on the HuggingFace Hub; "
            "use a branch, tag or commit hash the repository has"
        ) from None
    except RemoteEntryNotFoundError:
        raise UsageError(
            f"{name} is not {_WHAT[kind]} repository (it has no {_REQUIRED[kind]}); check the id"
        ) from None
    except HfHubHTTPError as err:
        raise UsageError(
            f"could not download {name} from the HuggingFace Hub ({str(err).splitlines()[0]}); try again later"
        ) from None
    except OSError as err:  # writing the cache: read-only, full disk, a file in the way
        with os_errors(
            cache, "cannot write the HuggingFace cache", hint="set HF_HUB_CACHE (or HF_HOME) to a writable directory"
        ):
            raise err from None


def _locate(spec: str) -> tuple[HubId, str | None, Path, bool]:
    """(hub id, revision to ask for, cache dir, offline) for ``spec``; UsageError when it is not a hub id."""
    hub = parse_hub_id(spec)
    if hub is None:
        raise UsageError(f"{spec!r} is not a hub id; write ORG/NAME or ORG/NAME@REVISION (a branch, tag or commit)")
    cache = hub_cache_dir()
    offline = _offline()
    revision = (_expand_short_hash(hub, cache) if offline else None) or hub.revision
    return hub, revision, cache, offline


def hub_config_dir(spec: str) -> Path:
    """The snapshot directory of ``ORG/NAME[@REV]`` holding at least its config.json (fetched alone when online).

    Lets a caller refuse a base (remote code, memory) before its weights are downloaded.
    """
    from huggingface_hub import hf_hub_download

    hub, revision, cache, offline = _locate(spec)
    with _hub_errors(hub, cache, offline):
        path = hf_hub_download(hub.repo_id, "config.json", revision=revision, cache_dir=cache, local_files_only=offline)
    return Path(path).parent


def _check_files(folder: Path, name: str, kind: str) -> None:
    """UsageError when the snapshot lacks its config or holds no safetensors weights."""
    required = _REQUIRED[kind]
    if not (folder / required).is_file():
        raise UsageError(f"{name} is not {_WHAT[kind]} repository (its snapshot has no {required}); check the id")
    if not any(folder.glob("*.safetensors")):
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        found = f" (it holds {', '.join(pickled)})" if pickled else ""
        raise UsageError(
            f"{name} has no .safetensors weights{found}; anchorlens never unpickles .bin files: "
            "use a revision with safetensors (the Hub's conversion bot opens one as refs/pr/N) or convert it first"
        )


def resolve_hub_dir(spec: str, kind: Literal["model", "adapter"] = "model") -> tuple[Path, dict[str, Any]]:
    """``ORG/NAME[@REV]`` -> (snapshot directory, provenance) through the HF cache, downloading when online.

    Provenance keys: kind ("hub"), spec, repo_id, revision (asked; "main" when none), commit (the
    snapshot's 40-hex hash), path (the snapshot directory).
    """
    from huggingface_hub import constants, snapshot_download

    if kind not in _REQUIRED:
        raise UsageError(f"unknown hub kind {kind!r}; choose model or adapter")
    hub, revision, cache, offline = _locate(spec)
    with _hub_errors(hub, cache, offline, kind):
        folder = Path(
            snapshot_download(
                hub.repo_id,
                revision=revision,
                cache_dir=cache,
                local_files_only=offline,
                allow_patterns=ALLOW_PATTERNS,
                ignore_patterns=IGNORE_PATTERNS,
            )
        )
    _check_files(folder, _display(hub), kind)
    provenance = {
        "kind": "hub",
        "spec": spec,
        "repo_id": hub.repo_id,
        "revision": hub.revision or constants.DEFAULT_REVISION,
        "commit": folder.name,
        "path": str(folder),
    }
    return folder, provenance


def cached_snapshot_facts(path: Path) -> dict[str, Any]:
    """repo_id and commit of a directory inside an HF cache (``models--ORG--NAME/snapshots/<hash>``), else {}."""
    resolved = path.resolve() if path.is_symlink() else path
    parts = resolved.absolute().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        repo = parts[-3].removeprefix("models--").replace("--", "/")
        return {"repo_id": repo, "commit": parts[-1]}
    return {}
