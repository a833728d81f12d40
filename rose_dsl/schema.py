"""Schema check: the YAML document against `schema/rose-workflow-<version>.schema.json`.

jsonschema reports `oneOf` failures as one opaque error; we pick the item kind from its key (`node`,
`loop`, `merge`) and validate against that branch instead, so the user sees "unknown key 'cal' in a
node; did you mean 'call'?" at the key's line and column, not a list of every branch that failed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from .errors import Diagnostic, did_you_mean, format_path
from .loader import Document

__all__ = ["SUPPORTED_VERSIONS", "schema_path", "load_schema", "check_schema", "exclusive_one_of_as_any_of"]

SUPPORTED_VERSIONS = (1,)
_ITEM_KINDS = ("node", "loop", "merge")


def schema_path(version: int) -> Traversable:
    """The schema file as package data (`rose_dsl/schemas/` links to the top-level `schema/`; an installed
    wheel holds a copy), so a non-editable install finds it too."""
    return resources.files("rose_dsl") / "schemas" / f"rose-workflow-{version}.schema.json"


@functools.cache
def load_schema(version: int = 1) -> dict[str, Any]:
    return json.loads(schema_path(version).read_text())


@functools.cache
def _validator(version: int) -> Draft202012Validator:
    return Draft202012Validator(load_schema(version))


FAST_MODULE = "rose_dsl._schema_v1_fast"


_TYPES = {"integer": {"integer"}, "number": {"integer", "number"}}  # JSON types a `type` name admits


def _admitted(branch: Any) -> set[str] | None:
    """The JSON types a schema branch can accept, or None when it does not say (no `type`)."""
    kind = branch.get("type") if isinstance(branch, dict) else None
    if kind is None:
        return None
    return {t for name in ([kind] if isinstance(kind, str) else kind) for t in _TYPES.get(name, {name})}


def exclusive_one_of_as_any_of(schema: Any) -> Any:
    """The same schema, with every `oneOf` whose branches admit disjoint JSON types written `anyOf`.

    Both accept exactly the same documents (no value can match two branches of different types), but
    fastjsonschema checks a `oneOf` by trying every branch and a failing branch raises an exception with
    a formatted message: on a 10,000-node workflow, a third of validation time went into the integer
    branch of each string input. An `anyOf` stops at the first branch that matches."""
    if isinstance(schema, list):
        return [exclusive_one_of_as_any_of(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: exclusive_one_of_as_any_of(v) for k, v in schema.items()}
    branches = out.get("oneOf")
    if isinstance(branches, list) and "anyOf" not in out:
        kinds = [_admitted(b) for b in branches]
        if all(k is not None for k in kinds) and all(
                not (kinds[i] & kinds[j]) for i in range(len(kinds)) for j in range(i)):  # type: ignore[operator]
            out["anyOf"] = out.pop("oneOf")
    return out


def fast_validator_source(version: int = 1) -> str:
    """The schema compiled to Python by fastjsonschema (checked in as `_schema_v1_fast.py`, regenerated
    by `python -m rose_dsl.schema` when the schema changes; a test checks it is current). It only says
    valid or not (jsonschema explains a failure), so it compiles an equivalent, faster form."""
    import fastjsonschema

    schema = exclusive_one_of_as_any_of(load_schema(version))
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"  # the draft fastjsonschema compiles
    digest = hashlib.sha256(json.dumps(load_schema(version), sort_keys=True).encode()).hexdigest()
    header = (f"# Generated from schema/rose-workflow-{version}.schema.json (sha256 {digest}) by\n"
              "# `python -m rose_dsl.schema`. Do not edit.\n# ruff: noqa\n")
    code = fastjsonschema.compile_to_code(schema)
    entry = code.split("\ndef ", 1)[1].split("(", 1)[0]  # the first function validates the whole document
    return header + code + f"\n\nvalidate = {entry}\n"


@functools.cache
def _fast(version: int):
    """The generated validator, or None (not generated, or fastjsonschema missing): jsonschema then."""
    if version != 1:
        return None
    try:
        module = importlib.import_module(FAST_MODULE)
    except ImportError:
        return None
    return module.validate


def describe_value(value: Any) -> str:
    """A value as a message names it: its kind in words and the value (`a number (2.5)`)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "object": "a mapping",
               "array": "a list", "boolean": "true or false", "null": "null"}


def check_schema(doc: Document) -> list[Diagnostic]:
    """Every schema violation in the document, positioned; [] when it conforms."""
    data = doc.data
    if not isinstance(data, dict):
        return [Diagnostic(doc.pos(()), "<document>", f"a workflow is a mapping; found {describe_value(data)}",
                           "start with 'rose: 1'")]
    version = data.get("rose")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:  # True == 1 in Python
        if "rose" not in data:
            return [Diagnostic(doc.pos(()), "rose", "missing the format version 'rose: 1'",
                               "the first line of a workflow is 'rose: 1'")]
        return [Diagnostic(doc.pos(("rose",)), "rose", f"unsupported format version {version!r}",
                           f"this rose reads version(s) {', '.join(map(str, SUPPORTED_VERSIONS))}")]
    fast = _fast(version)
    if fast is not None:
        try:
            fast(data)
            return []  # valid: the (slow, precise) jsonschema pass is only needed to explain errors
        except Exception:  # noqa: BLE001 - any complaint: let jsonschema say exactly what and where
            pass
    diags: list[Diagnostic] = []
    validator = _validator(version)
    for err in validator.iter_errors(data):
        diags.extend(_explain(err, doc, validator, ()))
    # One message per (path, message): jsonschema may reach the same fault through two routes.
    unique = {(d.path, d.message): d for d in diags}
    return list(unique.values())


def _explain(err: ValidationError, doc: Document, validator: Draft202012Validator,
             prefix: tuple) -> list[Diagnostic]:
    path = prefix + tuple(err.absolute_path) if not prefix else prefix + tuple(err.path)
    where = format_path(path)
    inst = err.instance
    kind = err.validator
    if kind == "oneOf" and isinstance(inst, dict) and _is_item_schema(err.schema):
        present = [k for k in _ITEM_KINDS if k in inst]
        if len(present) != 1:
            msg = ("an item needs exactly one of 'node:', 'loop:' or 'merge:'" if not present
                   else f"an item has both {' and '.join(repr(p + ':') for p in present)}")
            return [Diagnostic(doc.pos(path), where, msg)]
        sub = validator.evolve(schema={"$ref": f"#/$defs/{present[0]}"})
        out: list[Diagnostic] = []
        for sub_err in sub.iter_errors(inst):
            out.extend(_explain(sub_err, doc, validator, path))
        return out
    if kind == "oneOf" and isinstance(err.schema, dict):
        out = _branches(err.schema.get("oneOf", []), inst, doc, validator, path, where)
        if out:
            return out
    if kind == "additionalProperties" and isinstance(inst, dict):
        present = [k for k in _ITEM_KINDS if k in inst]
        if len(present) > 1 and any(k in inst for k in ("call", "body", "from")):  # an item of two kinds: the cause
            return [Diagnostic(doc.pos(path), where,
                               f"an item has both {' and '.join(repr(p + ':') for p in present)}",
                               "an item is one node, one loop or one merge: split it into two items")]
        allowed = list(err.schema.get("properties", {}))
        out = []
        for key in inst:
            if key in allowed or not allowed:
                continue
            out.append(Diagnostic(doc.key_pos(path + (key,)), format_path(path + (key,)),
                                  f"unknown key '{key}'" + (f" in {_what(path, inst)}" if _what(path, inst) else ""),
                                  did_you_mean(key, allowed) or f"allowed keys: {', '.join(allowed)}"))
        if out:
            return out
        return [Diagnostic(doc.pos(path), where, err.message)]
    if kind == "required" and isinstance(inst, dict) and not any(k in inst for k in _ITEM_KINDS) \
            and _ITEM_KINDS[0] in str(err.validator_value) and "call" not in str(err.validator_value):
        return [Diagnostic(doc.pos(path), where, "an item needs exactly one of 'node:', 'loop:' or 'merge:'")]
    if kind == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        return [Diagnostic(doc.pos(path), where, f"missing required key '{missing}'" +
                           (f" in {_what(path, inst)}" if _what(path, inst) else ""))]
    if kind == "type":
        wanted = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        words = " or ".join(_TYPE_WORDS.get(str(w), str(w)) for w in wanted)
        return [Diagnostic(doc.pos(path), where, f"expected {words}; found {describe_value(inst)}")]
    if kind in ("enum", "const"):
        options = err.validator_value if kind == "enum" else [err.validator_value]
        hint = did_you_mean(str(inst), [str(o) for o in options])
        return [Diagnostic(doc.pos(path), where,
                           f"{describe_value(inst)} is not one of {', '.join(map(repr, options))}", hint)]
    if kind == "pattern":
        what = _pattern_word(path)
        form = (" (letters, digits and '_', not starting with a digit)" if what == "name" else "")
        if "propertyNames" in err.schema_path and isinstance(inst, str):  # a key: at the key, not the mapping
            key = path + (inst,)
            return [Diagnostic(doc.key_pos(key), format_path(key), f"{inst!r} is not a valid {what}{form}")]
        return [Diagnostic(doc.pos(path), where, f"{describe_value(inst)} is not a valid {what}{form}")]
    if kind == "anyOf" and isinstance(inst, dict) and "loop" in inst:
        if any(did_you_mean(str(k), ["count", "until"]) for k in inst if k not in ("count", "until")):
            return []  # a misspelled `count:`: the unknown-key message (with its did-you-mean) is the cause
        return [Diagnostic(doc.pos(path), where, "a loop needs 'count:' (a static count) or 'until:' (a dynamic end)")]
    if kind == "anyOf" and isinstance(err.schema, dict):  # (`max_staleness: -1` was "not valid under any of ...")
        out = _branches(err.schema.get("anyOf", []), inst, doc, validator, path, where)
        if out:
            return out
    if kind in ("minimum", "exclusiveMinimum", "maximum", "minItems", "maxItems", "minProperties",
                "uniqueItems", "minLength"):
        return [Diagnostic(doc.pos(path), where, err.message.replace("is less than", "is below"))]
    return [Diagnostic(doc.pos(path), where, err.message)]


def _branches(branches: list[Any], inst: Any, doc: Document, validator: Draft202012Validator, path: tuple,
              where: str) -> list[Diagnostic]:
    """Why `inst` matches none of a `oneOf`/`anyOf`'s branches: the bounds or the inner fault of the branch
    whose type it has, else the types the branches take; [] when nothing more precise can be said."""
    same_type = [b for b in branches if isinstance(b, dict) and "type" in b
                 and any(validator.is_type(inst, t) for t in (b["type"] if isinstance(b["type"], list) else [b["type"]]))]
    if same_type:  # the value has a type a branch takes, and breaks that branch's bounds: say which
        out = _bounds(same_type[0], inst, doc, path, where)
        if out:
            return out
        # a value that breaks its own branch otherwise: say how (a mapping or list: where inside; `batch: {dim:
        # 0, size: 0}` was "expected a mapping; found a mapping" at `batch`)
        sub_errors = list(validator.evolve(schema=same_type[0]).iter_errors(inst))
        out = [d for sub_err in sub_errors for d in _explain(sub_err, doc, validator, path)]
        if out:
            return out
    wanted = [b.get("type") for b in branches if isinstance(b, dict) and "type" in b]
    if wanted:
        words = " or ".join(_TYPE_WORDS.get(w, str(w)) for w in wanted if isinstance(w, str))
        return [Diagnostic(doc.pos(path), where, f"expected {words}; found {describe_value(inst)}")]
    return []


def _bounds(branch: dict[str, Any], inst: Any, doc: Document, path: tuple, where: str) -> list[Diagnostic]:
    """A number outside a `minimum`/`maximum` range, worded as the loader words a ${params} value out of it
    (`mps_quota: 150` -> "must be between 1 and 100; found 150"); [] for any other fault."""
    low, high = branch.get("minimum"), branch.get("maximum")
    if not isinstance(inst, (int, float)) or isinstance(inst, bool) or (low is None and high is None):
        return []
    if (low is None or inst >= low) and (high is None or inst <= high):
        return []
    bounds = (f"between {low} and {high}" if low is not None and high is not None
              else f"at least {low}" if low is not None else f"at most {high}")
    return [Diagnostic(doc.pos(path), where, f"must be {bounds}; found {inst}")]


def _is_item_schema(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    refs = [b.get("$ref", "") for b in schema.get("oneOf", []) if isinstance(b, dict)]
    return any(r.endswith("/node") for r in refs)


def _what(path: tuple, inst: Any) -> str:
    if isinstance(inst, dict):
        for k in _ITEM_KINDS:
            if k in inst:
                return f"{k} '{inst[k]}'" if isinstance(inst[k], str) else f"a {k}"
        if len(path) == 2 and path[0] == "components":
            return f"component '{path[1]}'"
        if not path:
            return "the workflow"
    return ""


def _pattern_word(path: tuple) -> str:
    last = path[-1] if path else ""
    return {"call": "call (component.method)", "impl": "impl ('package.module:Class')"}.get(str(last), "name")


if __name__ == "__main__":
    (Path(__file__).parent / "_schema_v1_fast.py").write_text(fast_validator_source(1))
    print("wrote rose_dsl/_schema_v1_fast.py")
