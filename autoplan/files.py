"""Reading and writing autoplan's files (JSON and YAML), with one-line errors for bad ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from autoplan.errors import InputError

__all__ = ["file_sha256", "read_json_model", "read_yaml_model", "write_json_model"]

M = TypeVar("M", bound=BaseModel)


def _validation_line(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _validate(data: object, model: type[M], path: Path) -> M:
    if isinstance(data, dict) and "schema_version" in data:
        expected = model.model_fields["schema_version"].default
        if data["schema_version"] != expected:
            raise InputError(
                f"{path}: schema_version {data['schema_version']!r} is not one this autoplan "
                f"reads (it reads {expected})"
            )
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise InputError(
            f"{path}: not a valid {model.__name__}: {_validation_line(error)}"
        ) from None


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read: {error}") from None


def read_json_model(path: str | Path, model: type[M]) -> M:
    """Read a JSON file into ``model``; any problem is an InputError naming the file."""
    path = Path(path)
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not JSON: {error}") from None
    return _validate(data, model, path)


def read_yaml_model(path: str | Path, model: type[M]) -> M:
    """Read a YAML file into ``model``; any problem is an InputError naming the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(_read_text(path))
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not YAML: {' '.join(str(error).split())}") from None
    return _validate(data, model, path)


def write_json_model(path: str | Path, model: BaseModel) -> None:
    """Write ``model`` as indented JSON; the same model always gives the same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.model_dump_json(indent=2) + "\n")


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
