"""Reading and writing autoplan's files (JSON and YAML), with one-line errors for bad ones.

Reading is defensive, because files come from elsewhere: only regular files up to
``limits.MAX_INPUT_FILE_BYTES``; no duplicate keys, NaN or infinities; no nesting deeper than
``limits.MAX_NESTING_DEPTH``, no numbers beyond ``limits.MAX_FILE_INT``/``MAX_FILE_FLOAT``, no
control characters in strings, at most ``limits.MAX_YAML_ALIASES`` YAML aliases; then the
schema validates strictly (``true`` is not 1, ``"8"`` is not 8).

Writing is atomic: data goes to a temporary file in the target's folder, is flushed to disk
and renamed over the target, so an interrupted write leaves the old file whole. Commands check
their output paths first (``check_outputs``): never over one of their own inputs, never a
folder, a device or a path under a regular file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autoplan import limits
from autoplan.errors import InputError
from autoplan.names import printable

__all__ = [
    "atomic_output",
    "check_output_path",
    "check_outputs",
    "file_sha256",
    "parse_json_text",
    "read_json_data",
    "read_json_model",
    "read_yaml_model",
    "write_json_model",
    "write_text_atomic",
]

M = TypeVar("M", bound=BaseModel)

_MAX_MESSAGE = 400


def _where(path: Path | str) -> str:
    return printable(str(path))


def _validation_line(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return printable(f"{where}: {first['msg']}")[:_MAX_MESSAGE] + more


# --- Reading -----------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    """The file's text; only a regular file of bounded size (a FIFO or /dev/zero would block or
    never end)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{_where(path)}: no such file") from None
    except OSError as error:
        raise InputError(f"{_where(path)}: cannot read: {error.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{_where(path)}: is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{_where(path)}: not a regular file")
    if info.st_size > limits.MAX_INPUT_FILE_BYTES:
        raise InputError(
            f"{_where(path)}: {info.st_size} bytes; autoplan reads files of at most "
            f"{limits.MAX_INPUT_FILE_BYTES} bytes"
        )
    try:
        with open(path, "rb") as handle:
            data = handle.read(limits.MAX_INPUT_FILE_BYTES + 1)
    except OSError as error:
        raise InputError(f"{_where(path)}: cannot read: {error.strerror}") from None
    if len(data) > limits.MAX_INPUT_FILE_BYTES:
        raise InputError(f"{_where(path)}: larger than {limits.MAX_INPUT_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{_where(path)}: not UTF-8 text (byte {error.start})") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {printable(repr(key))[:60]} appears twice")
        out[key] = value
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number autoplan reads (finite numbers only)")


def parse_json_text(text: str, where: str) -> Any:
    """Parsed JSON of ``text``; InputError (one line, starting with ``where``) when it is not
    JSON autoplan reads: duplicate keys, NaN/Infinity, nesting too deep, huge numbers."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise InputError(f"{where}: not JSON: {error}") from None
    except RecursionError:
        raise InputError(f"{where}: nested deeper than {limits.MAX_NESTING_DEPTH} levels") from None
    except ValueError as error:  # duplicate keys, constants, ints of > 4300 digits
        raise InputError(f"{where}: not JSON autoplan reads: {printable(str(error))}") from None
    _check_tree(data, where)
    return data


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with a cap on alias references and no duplicate keys."""

    aliases_seen = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases_seen += 1
            if self.aliases_seen > limits.MAX_YAML_ALIASES:
                raise yaml.YAMLError(
                    f"more than {limits.MAX_YAML_ALIASES} alias references (*name)"
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    repeated = key in seen
                except TypeError:
                    repeated = False  # unhashable: the base class reports it
                if repeated:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {printable(repr(key))[:60]} appears twice",
                        key_node.start_mark,
                    )
                with contextlib.suppress(TypeError):
                    seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads 1e9 as a string; YAML 1.2 and every user read it as a number.
_BoundedLoader.yaml_implicit_resolvers = {
    key: list(value) for key, value in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


class _ShippedLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's parser where PyYAML has it, with the same reading of numbers, for the files
    autoplan ships (``read_yaml_model(..., shipped=True)``): several times faster than the
    pure-Python parser whose alias and nesting guards it skips (those files have neither)."""


_ShippedLoader.yaml_implicit_resolvers = _BoundedLoader.yaml_implicit_resolvers


def _parse_yaml_text(text: str, where: str, shipped: bool = False) -> Any:
    try:
        data = yaml.load(text, Loader=_ShippedLoader if shipped else _BoundedLoader)
    except yaml.YAMLError as error:
        raise InputError(f"{where}: not YAML: {printable(str(error))[:_MAX_MESSAGE]}") from None
    except RecursionError:
        raise InputError(f"{where}: nested deeper than {limits.MAX_NESTING_DEPTH} levels") from None
    _check_tree(data, where)
    return data


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""C0 controls but tab, line feed and carriage return; DEL and the C1 controls."""


def _bad_string(text: str) -> bool:
    """Control characters (terminal escapes and the like); tabs and line breaks are text.
    One regular-expression scan (a solve reads ~30 k characters of strings)."""
    return _CONTROL.search(text) is not None


def _check_tree(data: Any, where: str) -> None:
    """Refuse, with the location, what no autoplan file holds: non-JSON types (YAML dates, sets,
    bytes), non-finite or huge numbers, control characters, nesting past the limit. Iterative,
    and each container is visited once (YAML aliases may share one)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    visited: set[int] = set()
    while stack:
        value, loc, depth = stack.pop()
        at = loc or "top level"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            if abs(value) > limits.MAX_FILE_INT:
                raise InputError(
                    f"{where}: {at}: number too large (limit {limits.MAX_FILE_INT:.0e})"
                )
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise InputError(f"{where}: {at}: {value} is not a finite number")
            if abs(value) > limits.MAX_FILE_FLOAT:
                raise InputError(
                    f"{where}: {at}: number too large (limit {limits.MAX_FILE_FLOAT:g})"
                )
            continue
        if isinstance(value, str):
            if _bad_string(value):
                raise InputError(f"{where}: {at}: text holds a control character")
            continue
        if isinstance(value, dict | list):
            if depth >= limits.MAX_NESTING_DEPTH:
                raise InputError(f"{where}: nested deeper than {limits.MAX_NESTING_DEPTH} levels")
            if id(value) in visited:
                continue
            visited.add(id(value))
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise InputError(
                            f"{where}: {at}: key {printable(repr(key))[:60]} is not text"
                        )
                    if _bad_string(key):
                        raise InputError(f"{where}: {at}: a key holds a control character")
                    stack.append((item, f"{loc}.{key}" if loc else key, depth + 1))
            else:
                for index, item in enumerate(value):
                    stack.append((item, f"{loc}.{index}" if loc else str(index), depth + 1))
            continue
        raise InputError(
            f"{where}: {at}: a {type(value).__name__} value is not allowed here (JSON types only)"
        )


def _upgrade(data: object, model: type[M], where: str) -> object:
    """Data of an older schema version converted to the current one, where the model knows
    how (a classmethod ``upgrade_data(dict) -> dict`` that raises ValueError when it cannot)."""
    upgrade = getattr(model, "upgrade_data", None)
    if upgrade is None or not isinstance(data, dict):
        return data
    try:
        return upgrade(data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise InputError(f"{where}: {printable(str(error))[:_MAX_MESSAGE]}") from None


def _validate(data: object, model: type[M], where: str) -> M:
    data = _upgrade(data, model, where)
    if isinstance(data, dict) and "schema_version" in data:
        expected = model.model_fields["schema_version"].default
        if data["schema_version"] != expected or isinstance(data["schema_version"], bool):
            raise InputError(
                f"{where}: schema_version {printable(repr(data['schema_version']))[:40]} is not "
                f"one this autoplan reads (it reads {expected})"
            )
    try:
        # Strict: a file's `true` is not the integer 1 and "8" is not 8.
        return model.model_validate(data, strict=True)
    except ValidationError as error:
        raise InputError(
            f"{where}: not a valid {model.__name__}: {_validation_line(error)}"
        ) from None
    except RecursionError:
        raise InputError(f"{where}: nested too deeply") from None


def read_json_data(path: str | Path) -> Any:
    """A JSON file's data, read defensively (module docstring) but not validated against a
    schema: for files of other tools (a Hugging Face config.json) that the caller reads key by
    key. Any problem is an InputError naming the file."""
    path = Path(path)
    return parse_json_text(_read_text(path), _where(path))


def read_json_model(path: str | Path, model: type[M]) -> M:
    """Read a JSON file into ``model``; any problem is an InputError naming the file."""
    path = Path(path)
    where = _where(path)
    return _validate(parse_json_text(_read_text(path), where), model, where)


def read_yaml_model(path: str | Path, model: type[M], *, shipped: bool = False) -> M:
    """Read a YAML file into ``model``; any problem is an InputError naming the file.
    ``shipped``: a file of autoplan's own (the GPU catalog), read with libyaml's parser."""
    path = Path(path)
    where = _where(path)
    return _validate(_parse_yaml_text(_read_text(path), where, shipped), model, where)


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    path = Path(path)
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as error:
        raise InputError(f"{_where(path)}: cannot read: {error.strerror}") from None


# --- Output paths ------------------------------------------------------------------------------


def _existing_ancestor(path: Path) -> Path:
    for parent in path.parents:
        if os.path.lexists(parent):
            return parent
    return Path("/")


def check_output_path(
    path: str | Path, inputs: Iterable[str | Path] = (), what: str = "output"
) -> Path:
    """``path`` if a file can be written there: not a folder or device, not under a regular
    file, in a writable place, and not one of ``inputs`` (the same file by any name). Raises
    InputError with one line otherwise. Nothing is created."""
    path = Path(path)
    if str(path) in ("", "."):
        raise InputError(f"{what}: an empty path")
    where = _where(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except NotADirectoryError:
        ancestor = _existing_ancestor(Path(os.path.abspath(path)))
        raise InputError(f"{what} {where}: {_where(ancestor)} is a file, not a folder") from None
    except OSError as error:
        raise InputError(f"{what} {where}: {error.strerror}") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise InputError(f"{what} {where}: is a folder; give a file name")
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{what} {where}: not a regular file (autoplan writes only files)")
        for source in inputs:
            with contextlib.suppress(OSError):
                if os.path.samefile(path, source):
                    raise InputError(
                        f"{what} {where} is this command's input {_where(source)}; "
                        "refusing to overwrite it (choose another output path)"
                    )
    else:
        ancestor = _existing_ancestor(Path(os.path.abspath(path)))
        if not ancestor.is_dir():
            raise InputError(f"{what} {where}: {_where(ancestor)} is not a folder")
    folder = path.parent if info is not None else _existing_ancestor(Path(os.path.abspath(path)))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{what} {where}: cannot write in {_where(folder)}")
    return path


def check_outputs(
    outputs: Mapping[str, str | Path | None], inputs: Iterable[str | Path | None] = ()
) -> None:
    """Check each named output path (None: not asked for) as ``check_output_path`` does, and
    that no two outputs are the same file."""
    sources = [Path(p) for p in inputs if p is not None]
    seen: dict[str, str] = {}
    for what, path in outputs.items():
        if path is None:
            continue
        check_output_path(path, sources, what)
        key = os.path.realpath(path)
        if key in seen:
            raise InputError(f"{what} and {seen[key]} are the same file {_where(path)}")
        seen[key] = what


# --- Atomic writes -----------------------------------------------------------------------------


def _default_mode(path: Path, mode: int | None) -> int:
    if mode is not None:
        return mode
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(path).st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_output(path: str | Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary path in ``path``'s folder to write to; on a clean exit it is flushed to disk
    and renamed over ``path`` (with ``mode``, else the old file's or a new file's usual mode).
    On an error the temporary file is removed and ``path`` is untouched; OSErrors become one
    InputError line."""
    target = Path(os.path.realpath(path))
    where = _where(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"cannot write {where}: a part of its folder is a file") from None
    except OSError as error:
        raise InputError(f"cannot write {where}: {error.strerror}") from None
    final_mode = _default_mode(target, mode)
    try:
        handle, name = tempfile.mkstemp(
            prefix=f".{target.name[:40]}.", suffix=".tmp", dir=target.parent
        )
    except OSError as error:
        raise InputError(f"cannot write {where}: {error.strerror}") from None
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb+") as written:
            os.fsync(written.fileno())
        os.chmod(temporary, final_mode)
        os.replace(temporary, target)
    except OSError as error:
        raise InputError(f"cannot write {where}: {error.strerror or error}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    # The rename is durable once the folder's entry is on disk too (best effort).
    with contextlib.suppress(OSError):
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def write_text_atomic(path: str | Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see ``atomic_output``)."""
    with atomic_output(path, mode) as temporary:
        temporary.write_text(text, encoding="utf-8")


def _first_non_finite(value: Any, loc: str = "") -> str | None:
    stack: list[tuple[Any, str]] = [(value, loc)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return at or "top level"
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{at}.{i}" if at else str(i)) for i, v in enumerate(item))
    return None


def write_json_model(path: str | Path, model: BaseModel) -> None:
    """Write ``model`` as indented JSON, atomically; the same model always gives the same
    bytes. A non-finite number is refused (JSON would hold null, which no reader accepts)."""
    bad = _first_non_finite(model.model_dump())
    if bad is not None:
        raise InputError(
            f"refusing to write {_where(path)}: {type(model).__name__} field {bad} is not a "
            "finite number"
        )
    write_text_atomic(path, model.model_dump_json(indent=2) + "\n")
