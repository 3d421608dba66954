"""docker/Dockerfile, checked on paper (no container engine runs here): parsed, every COPY
source exists in the build context and is not ignored, stages are defined before use; the
runtime installs the wheel, runs as a non-root user, declares the data volume and a healthcheck
running ``sabre-pg check``; docker/entrypoint.sh passes ``bash -n`` and never trusts."""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from sabre_pg.cluster import hba_allows_trust

REPO_DIR = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_DIR / "docker" / "Dockerfile"
ENTRYPOINT = REPO_DIR / "docker" / "entrypoint.sh"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments and parser directives dropped, continuation
    lines (a trailing backslash) joined."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue                       # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, args = full.partition(" ")
        out.append((word.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return out


def stages(parsed) -> list[dict]:
    """One dict per FROM: its name and its instructions."""
    out = []
    for word, args in parsed:
        if word == "FROM":
            parts = args.split()
            out.append({"image": parts[0], "name": parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None,
                        "steps": []})
        else:
            assert out, f"{word} before the first FROM"
            out[-1]["steps"].append((word, args))
    return out


def copy_args(args: str) -> tuple[dict, list[str], str]:
    """(flags, sources, destination) of a COPY (shell form or JSON form)."""
    words = json.loads(args) if args.startswith("[") else shlex.split(args)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    return flags, words[:-1], words[-1]


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore patterns exclude ``path`` or a folder above it (no ``!`` rules here)."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(p, pat) or fnmatch.fnmatch(p, pat.removeprefix("**/"))
               for pat in patterns for p in prefixes)


@pytest.fixture(scope="module")
def parsed():
    return stages(instructions(DOCKERFILE.read_text()))


def test_every_copy_source_exists_and_is_sent(parsed):
    patterns = [p.strip() for p in (REPO_DIR / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "ignored() does not handle ! rules"
    names = []
    for stage in parsed:
        for word, args in stage["steps"]:
            assert word != "ADD", "use COPY (ADD fetches URLs and unpacks archives)"
            if word != "COPY":
                continue
            flags, sources, _ = copy_args(args)
            assert sources, args
            if "from" in flags:
                assert flags["from"] in names, f"COPY --from={flags['from']}: no earlier stage of that name"
                continue
            for source in sources:
                matches = glob.glob(str(REPO_DIR / source))
                assert matches, f"COPY source {source} does not exist in the build context"
                for m in matches:
                    rel = os.path.relpath(m, REPO_DIR)
                    assert not ignored(rel, patterns), f"COPY source {rel} is excluded by .dockerignore"
        names.append(stage["name"])


def test_runtime_installs_the_wheel_as_a_non_root_user(parsed):
    build, runtime = parsed[0], parsed[-1]
    build_runs = " ".join(a for w, a in build["steps"] if w == "RUN")
    assert "-m build" in build_runs
    runs = " ".join(a for w, a in runtime["steps"] if w == "RUN")
    assert "pip install" in runs and ".whl" in runs and " -e " not in runs
    assert "postgresql-15" in runs and "postgresql-plpython3-15" in runs and "python3-numpy" in runs
    users = [a.split(":")[0] for w, a in runtime["steps"] if w == "USER"]
    assert users and users[-1] not in ("root", "0")
    volumes = [a for w, a in runtime["steps"] if w == "VOLUME"]
    env = " ".join(a for w, a in runtime["steps"] if w == "ENV")
    assert volumes and "PGDATA=" + volumes[-1].strip('[]" ') in env.replace(" ", "")
    health = [a for w, a in runtime["steps"] if w == "HEALTHCHECK"]
    assert len(health) == 1 and "CMD" in health[0]
    cmd = json.loads(health[0].split("CMD", 1)[1].strip())
    assert cmd[:2] == ["sabre-pg", "check"]
    entry = [json.loads(a) for w, a in runtime["steps"] if w == "ENTRYPOINT"][-1]
    copied = [copy_args(a) for w, a in runtime["steps"] if w == "COPY"]
    # the entrypoint comes from the build stage (which gives it its mode), copied there from the checkout
    origin = [src[0] for flags, src, dest in copied if dest == entry[0] and flags.get("from") == build["name"]]
    assert len(origin) == 1, "the ENTRYPOINT is not copied from the build stage"
    build_copies = [copy_args(a) for w, a in build["steps"] if w == "COPY"]
    assert any(src == ["docker/entrypoint.sh"] and dest == origin[0] for _, src, dest in build_copies)
    assert f"chmod 755 {origin[0]}" in build_runs


def test_builds_without_buildkit():
    """Debian 12's docker.io 20.10 legacy builder and podman: no parser directive (`# syntax`
    fetches a frontend from a registry) and no BuildKit-only flag or heredoc."""
    text = DOCKERFILE.read_text()
    for line in text.splitlines():
        assert not re.match(r"#\s*(syntax|escape|check)\s*=", line, re.I), f"parser directive: {line}"
        if line.lstrip().startswith("#"):
            continue
        for flag in ("--chmod", "--link", "--mount", "--network", "--security", "--parents", "--exclude"):
            assert flag not in line, f"BuildKit-only {flag}: {line}"
        assert not re.search(r"<<-?\s*['\"]?[A-Z]+", line), f"BuildKit-only heredoc: {line}"


def test_entrypoint_parses_and_never_trusts():
    subprocess.run(["bash", "-n", str(ENTRYPOINT)], check=True)
    text = ENTRYPOINT.read_text()
    assert os.access(ENTRYPOINT, os.X_OK)
    assert not hba_allows_trust(text)
    assert "--auth-local=peer" in text and "--auth-host=scram-sha-256" in text
    assert "POSTGRES_PASSWORD" in text and "sabre-pg install" in text


def test_parser_sees_what_it_must():
    text = "FROM a AS b\n# c\nRUN x \\\n  # inner\n  y\nCOPY --from=b /x /y\n"
    assert instructions(text) == [("FROM", "a AS b"), ("RUN", "x    y"), ("COPY", "--from=b /x /y")]
    assert copy_args('["a", "b", "/c/"]') == ({}, ["a", "b"], "/c/")
    assert ignored("sabre_pg/__pycache__/x.pyc", ["**/__pycache__"]) and not ignored("sql/a.sql", ["build"])
    assert hba_allows_trust("host all all 0.0.0.0/0 trust\n")


def test_entrypoint_refuses_root_and_a_missing_password(tmp_path):
    """Run for real up to its first refusal: as root it will not start the server; as another
    user, a first start without a password makes no cluster."""
    env = {"PATH": os.environ.get("PATH", ""), "PGDATA": str(tmp_path / "data")}
    res = subprocess.run(["bash", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    want = "refusing to run the server as root" if os.geteuid() == 0 else "set POSTGRES_PASSWORD"
    assert want in res.stderr
    assert not (tmp_path / "data" / "PG_VERSION").exists()
    other = subprocess.run(["bash", str(ENTRYPOINT), "echo", "hello"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert other.returncode == 0 and other.stdout == "hello\n"
