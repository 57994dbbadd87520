"""Finding, reading, trusting and loading the config file, and its compiled form.

Only the standard library is imported at the top; PyYAML when a YAML file is parsed.
"""

from __future__ import annotations

import os
import stat

from podvm_gpu.config.fields import MAX_CONFIG_BYTES, Invalid
from podvm_gpu.config.model import Config
from podvm_gpu.errors import ConfigError, one_line
from podvm_gpu.host.fs import untrusted_because
from podvm_gpu.model import shown


def parse_config(text: str, path: str) -> Config:
    """Validate the config text read from ``path`` (named in every message).

    Raises:
        ConfigError: not YAML, not a mapping, or a bad key or value; the message names the file
            and the first bad key (``persistenced.per_gpu_s``) and counts the others.
    """
    return validate(parse_yaml(text, path), path)


def parse_yaml(text: str, path: str) -> object:
    """The config text as PyYAML's safe loader reads it, refusing a key given twice in one
    mapping (PyYAML would keep the last one silently: ``budget_s: 1`` then ``budget_s: 2``).

    Raises:
        ConfigError: not YAML (also: nested too deeply, a number of more than 4300 digits), a
            duplicate key, named with its dotted path and both lines, or an alias (``*name``).
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node, path)
        return loader.construct_document(node)
    except (yaml.YAMLError, RecursionError, ValueError) as err:
        # ValueError: a number Python will not read (more than 4300 digits)
        for mark in (getattr(err, "context_mark", None), getattr(err, "problem_mark", None)):
            # the line and column only, never the text, which may hold a secret (a password
            # where a hash should be): libyaml's marks have no text, PyYAML's own quote it
            if isinstance(mark, yaml.error.Mark):
                mark.buffer = None
        import re

        # PyYAML names the text it was given, not the file: 'in "<unicode string>", line 2'
        what = re.sub(r'\bin "<unicode string>", line', "at line", " ".join(str(err).split()))
        if isinstance(err, RecursionError) or "nesting depth" in what:
            what = "nested too deeply"
        elif isinstance(err, yaml.reader.ReaderError) and isinstance(err.position, int):
            what = _special(text, err.position, err.character)
        raise ConfigError(f"{path}: not valid YAML: {what[:300]}") from None
    finally:
        loader.dispose()


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _special(text: str, position: int, character) -> str:
    """PyYAML's ReaderError (``special characters are not allowed in "<unicode string>",
    position 13``) in the agent's words, with the line and column (issue 47 item 23)."""
    from podvm_gpu.model import shown

    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    char = chr(character) if isinstance(character, int) else str(character)
    name = "a NUL character" if char == "\x00" else "a character"
    why = "YAML takes no control characters" if shown(char) != char else \
        "YAML does not allow it"
    return (f"{name} ({shown(char) if shown(char) != char else repr(char)}) at line {line}, "
            f"column {column}: {why}")


def _refuse_duplicate_keys(root, path: str) -> None:
    """Raise :class:`ConfigError` for the first mapping of the node tree ``root`` that holds a
    key twice (the same tag and text; ``<<`` merge keys may repeat, as YAML 1.1 allows), and for
    the first alias (a node reached twice): with aliases a 90 KB file expands to 200 MB, without
    them the settings are no larger than the text (at most 1 MiB)."""
    import yaml

    todo, seen_nodes = [(root, ())], set()
    while todo:  # depth first in document order: an anchor is met before its aliases
        node, where = todo.pop()
        if id(node) in seen_nodes:
            # a node met twice is an alias (*name) of an anchored one (&name): refused, since
            # 90 KB of aliases to one long string make 200 MB of settings (issue 29, item 4)
            dotted = shown(one_line(".".join(where), 200)) or "(top level)"
            raise ConfigError(f"{path}: {dotted}: a YAML alias (*name): aliases are not taken "
                              "(each one copies what its anchor holds); write the value out")
        seen_nodes.add(id(node))
        children = []
        if isinstance(node, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
                    if key in lines:
                        dotted = shown(one_line(".".join((*where, str(name))), 200))
                        raise ConfigError(f"{path}: {dotted}: duplicate key (lines {lines[key]} "
                                          f"and {line}): say it once")
                    lines[key] = line
                children += [(key_node, (*where, str(name))), (value_node, (*where, str(name)))]
        elif isinstance(node, yaml.SequenceNode):
            # an item's index as the validator names it (persistenced.args.1), one form only
            children = [(item, (*where, str(i))) for i, item in enumerate(node.value)]
        todo.extend(reversed(children))


def validate(raw: object, path: str) -> Config:
    """The config from the parsed document ``raw`` (None: the defaults).

    Raises:
        ConfigError: not a mapping, or a bad key or value (see :func:`parse_config`).
    """
    if raw is None:
        return Config()
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a mapping of settings, not {type(raw).__name__}")
    control = _control_characters(raw)
    errors: list[Invalid] = []
    try:
        config = Config.validate(raw, [], errors)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    # a value or key refused for its control character is one problem: its field's own check
    # (a NUL is in no absolute path, a key with ESC is unknown) must not count it again
    said = {tuple(e.loc) for e in control}
    errors = control + [e for e in errors if tuple(e.loc) not in said]
    if errors:
        first = errors[0]
        # a key may hold line breaks, ESC or be long: the message stays one bounded line, its
        # control characters escaped (it reaches terminals, the journal and the console)
        # a YAML null key (~) is None here: named as written
        key = shown(one_line(".".join("~" if p is None else str(p) for p in first.loc), 200)) \
            or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        message = shown(" ".join(first.message.split())[:300])
        raise ConfigError(f"{path}: {key}: {message}{more}")
    return config


def _control_characters(raw: object) -> list[Invalid]:
    """An error for every key or string value of the document ``raw`` that holds a control
    character (NUL, ESC, a line break: C0 and DEL). No setting needs one; a NUL makes a path
    unusable (``ValueError: embedded null byte`` where it is opened) and ESC moves the cursor
    of whoever reads a message that quotes it."""
    found: list[Invalid] = []
    todo: list[tuple[object, list]] = [(raw, [])]
    while todo and len(found) < 100:
        value, loc = todo.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and shown(key) != key:
                    found.append(Invalid([*loc, key], f"a key with a {_first_control(key)}"))
                todo.append((item, [*loc, key]))
        elif isinstance(value, list):
            todo.extend((item, [*loc, i]) for i, item in enumerate(value))
        elif isinstance(value, str) and shown(value) != value:
            found.append(Invalid(loc, f"holds a {_first_control(value)}: no setting takes one"))
    return found


def _first_control(text: str) -> str:
    """``NUL character (\\x00)`` or ``control character (\\x1b)``: the first one in ``text``."""
    found = next(c for c in text if shown(c) != c)
    return f"{'NUL' if found == chr(0) else 'control'} character ({shown(found)})"


# --- the compiled form: the YAML parsed once, at image build ----------------------------------
# Every CPU pod VM whose image ships a config file validates it at boot; PyYAML's import (it
# imports re) costs that boot about as much as all the rest of it (bench/run.py: 4x `python -c
# pass` with the YAML, 1.3x with this). So the image build (install-podvm-gpu.sh, or `podvm-gpu
# config --compile` after a change) writes, next to the config, the document PyYAML read from it
# together with the exact text it was read from. Boot uses it only while the config's text is
# that text, byte for byte, and validates it as it validates the YAML; otherwise it parses the
# YAML. Nothing is trusted that the YAML would not give.

COMPILED_SUFFIX = ".compiled.json"
# 2: made by a version that refuses duplicate keys (a form of 1 may hide one: it is stale)
# 3: with "digest", the settings bound to their source (a form of 2 may have been edited)
COMPILED_FORMAT = "podvm-gpu config, compiled, 3"
_NOT_COMPILED = object()
_EDITED = object()  # format and source match, the settings are not what was compiled
EDITED = ("was edited after it was compiled (its settings do not match its digest, so they may "
          "not be what its source says): ignored, the YAML is read")


def _digest(text: str, settings: object) -> str:
    """The digest binding a compiled form's ``settings`` to its ``source`` ``text``: BLAKE2b
    (128 bits) of the text, a NUL and the settings as :func:`~podvm_gpu.jsontext.dumps` writes
    them. It catches a hand edit of ``settings`` that kept ``source``, not an attack: whoever
    can write the compiled file can write the config too (boot trusts neither unless root's).
    ``_blake2``, the C module under hashlib's blake2b: hashlib also loads OpenSSL (2 ms)."""
    from _blake2 import blake2b

    from podvm_gpu.jsontext import dumps

    return blake2b(f"{text}\0{dumps(settings)}".encode("utf-8", "surrogatepass"),
                   digest_size=16).hexdigest()


def compiled_path(path: str) -> str:
    """Where the compiled form of the config at ``path`` lives: ``<path>.compiled.json``."""
    return path + COMPILED_SUFFIX


def compile_config(path: str) -> tuple[Config, str]:
    """Validate the config at ``path`` and write its compiled form beside it (atomically, 0644).

    Returns:
        The config and the compiled file's path.

    Raises:
        ConfigError: the config is missing, unreadable or invalid (nothing is written), or the
            compiled file cannot be written (named, never its temporary file: ``<path>.compiled
            .json: cannot write: No space left on device``).
    """
    from podvm_gpu.host.fs import atomic_write
    from podvm_gpu.jsontext import dumps

    text = read_config_text(path, required=True)
    raw = parse_yaml(text, path)
    config = validate(raw, path)
    target = compiled_path(path)
    try:
        atomic_write(target, dumps({"format": COMPILED_FORMAT, "source": text, "settings": raw,
                                    "digest": _digest(text, raw)}) + "\n")
    except OSError as err:
        raise ConfigError(f"{target}: cannot write: {err.strerror or err}") from None
    return config, target


def compiled_settings(path: str, text: str, trusted: bool = False) -> object:
    """The document of the compiled form of the config at ``path`` if it was made from exactly
    ``text``; :data:`_NOT_COMPILED` when there is none, it is stale, unreadable, not ours, or
    (``trusted``) another user than root could have written it; :data:`_EDITED` when its
    settings no longer match its digest (edited by hand, ``source`` kept)."""
    from podvm_gpu.jsontext import loads

    try:
        fd = os.open(compiled_path(path), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return _NOT_COMPILED
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 4 * MAX_CONFIG_BYTES or (
                trusted and untrusted_because(compiled_path(path), info)):
            return _NOT_COMPILED
        data = os.read(fd, 4 * MAX_CONFIG_BYTES + 1)
    except OSError:
        return _NOT_COMPILED
    finally:
        os.close(fd)
    try:
        doc = loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _NOT_COMPILED
    if not isinstance(doc, dict) or doc.get("format") != COMPILED_FORMAT \
            or doc.get("source") != text or "settings" not in doc:
        return _NOT_COMPILED
    try:
        if doc.get("digest") != _digest(text, doc["settings"]):
            return _EDITED
    except (TypeError, ValueError, RecursionError):  # settings JSON cannot hold: not ours
        return _EDITED
    return doc["settings"]


def compiled_state(path: str) -> str | None:
    """``None`` when the config at ``path`` has a current compiled form, else why not (for
    ``check --image``): missing, or made from another text."""
    try:
        text = read_config_text(path)
    except ConfigError:
        return None  # the config itself is the problem; the config check says so
    if text is None:
        return None
    found = compiled_settings(path, text)
    if found is _EDITED:
        return f"{compiled_path(path)} {EDITED}"
    if found is not _NOT_COMPILED:
        return None
    if os.path.lexists(compiled_path(path)):
        return f"{compiled_path(path)} was made from another version of the config"
    return f"{compiled_path(path)} is missing"


DEFAULT_PATH = "/etc/podvm-gpu/config.yaml"


def config_location(root, config: str | None) -> tuple[str, bool]:
    """Where a command's config is, and whether it must be read (``podvm-gpu config``, ``check``,
    ``metrics``; boot does the same on its fast path, boot.py ``_boot``).

    Args:
        root: the :class:`podvm_gpu.host.fs.Root`.
        config: ``--config`` / ``PODVM_GPU_CONFIG`` when given (it must then exist), else None.

    Returns:
        ``(path, required)``: the file's real path (the default path under the root, links
        followed chroot-style) and True when a file must be there: one was named, or an entry
        (a dangling link too) stands at the default path. ``(path, False)``: the defaults apply.

    Raises:
        ConfigError: the default path cannot be resolved under the root (a link loop).
    """
    if config:
        return config, True
    try:
        entry = root.resolve(DEFAULT_PATH, follow_last=False)
        if not os.path.lexists(entry):
            return entry, False
        why = link_to_nothing(root)
        if why:
            raise ConfigError(why)
        return root.resolve(DEFAULT_PATH), True
    except OSError as err:
        raise ConfigError(f"{root.path.rstrip('/')}{DEFAULT_PATH}: cannot resolve: "
                          f"{err.strerror or err}") from err


def link_to_nothing(root) -> str | None:
    """The error for a default config path that is a link to nothing, naming the config and
    then its target (the target alone, ``.../gone.yaml: no such file``, named a file the user
    never wrote; issue 35 item 14); None when it is not one.

    Raises:
        OSError: the path cannot be resolved under the root (a link loop).
    """
    entry = root.resolve(DEFAULT_PATH, follow_last=False)
    if not os.path.islink(entry):
        return None
    real = root.resolve(DEFAULT_PATH)
    if os.path.lexists(real):
        return None
    return f"{entry}: a link to nothing ({real}: no such file)"


def load_config(path: str, *, required: bool = False, trusted: bool = False,
                warn=None) -> Config:
    """Load and validate the config file at ``path``; the defaults when there is no file.

    Read through its compiled form when that was made from the same text (see
    :func:`compile_config`), else parsed with PyYAML; validated in both cases.

    Args:
        path: the config file's real path.
        required: the file was asked for (``--config``, ``PODVM_GPU_CONFIG``), so a missing one
            is an error rather than the defaults.
        trusted: refuse a file that someone other than root could have written (boot, which
            runs the tools it names as root): see :func:`untrusted_because`.
        warn: called with one line (``<path>.compiled.json was edited ...``) when the compiled
            form was edited by hand and is ignored for that.

    Raises:
        ConfigError: see :func:`read_config_text` and :func:`parse_config`.
    """
    text = read_config_text(path, required=required, trusted=trusted)
    if text is None:
        return Config()
    raw = compiled_settings(path, text, trusted)
    if raw is _EDITED and warn is not None:
        warn(f"{compiled_path(path)} {EDITED}")
    if raw is _NOT_COMPILED or raw is _EDITED:
        return parse_config(text, path)
    # the YAML is right or wrong by its own text: a bad compiled form is the compiled form's
    return validate(raw, f"{compiled_path(path)} (compiled from {path}; run podvm-gpu config "
                         "--compile again)")


def read_config_text(path: str, *, required: bool = False, trusted: bool = False) -> str | None:
    """The config file's text; None when it does not exist and was not asked for.

    Only a regular file of at most 1 MiB is read, opened without blocking: a FIFO or a device
    given as the config must not hang or flood the boot. A dangling link where the file should
    be is an error, not "no config".

    Raises:
        ConfigError: missing though required (or a dangling link), not a regular file, too
            large, unreadable, not UTF-8, or (``trusted``) writable by another user than root.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if required or os.path.islink(path):
            raise ConfigError(f"{path}: no such file" + (" (a dangling link)" if
                                                         os.path.islink(path) else "")) from None
        return None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: not a regular file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
        why = untrusted_because(path, info) if trusted else None
        if why:
            raise ConfigError(f"{path}: not trusted: {why}; boot runs the tools a config names "
                              "as root, so only root may be able to write it")
        data = os.read(fd, MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
