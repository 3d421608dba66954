"""docker/Dockerfile, checked on paper and for real.

On paper: parsed, every COPY source exists in the build context and is not ignored, stages are
defined before use, no BuildKit-only syntax; the runtime installs the wheel, runs as a non-root
user, declares the data volume and a healthcheck running ``sabre-pg check``;
docker/entrypoint.sh passes ``bash -n`` and never trusts.

For real (``podman`` marker): podman (installed here with apt-get when missing) builds the image
from the debian:12-slim that ../shared/container-base/make-base.sh makes, and runs it. Under
CI=true nothing may be missing: the test fails instead of skipping. It is scheduled first
(tests/conftest.py) so that its few minutes overlap the rest of the suite."""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import psycopg
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


# ---- the image for real: built and run with podman ------------------------------------------

CONTAINER_BASE = REPO_DIR.parent / "shared" / "container-base"
PODMAN_PACKAGES = ["podman", "buildah", "mmdebstrap", "uidmap", "fuse-overlayfs", "slirp4netns", "runc",
                   "containernetworking-plugins"]   # ../shared/container-base/README.md
BASE_IMAGE = "docker.io/library/debian:12-slim"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str):
    """In CI the podman test must run: anything missing fails it; elsewhere it is skipped."""
    if IN_CI:
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def _install_podman() -> None:
    """apt-get install what ../shared/container-base needs, as .ci/run installs everything."""
    missing = [p for p in PODMAN_PACKAGES
               if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0]
    if not missing:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if sudo and not shutil.which("sudo"):
        _unavailable(f"podman is not installed and installing {missing} needs root or sudo")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        res = subprocess.run([*sudo, *cmd], env=env, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            _unavailable(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")


class Podman:
    """podman with the sandbox settings of ../shared/container-base/containers.conf."""

    def __init__(self):
        self.env = {**os.environ, "CONTAINERS_CONF": str(CONTAINER_BASE / "containers.conf")}

    def __call__(self, *args, check=True, timeout=600, **kw) -> subprocess.CompletedProcess:
        res = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
        if check and res.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed ({res.returncode}):\n"
                                 f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
        return res

    def healthy(self, name: str, timeout: float = 240) -> None:
        """Run the image's HEALTHCHECK (`sabre-pg check`) until it passes (no systemd timer here)."""
        deadline = time.monotonic() + timeout
        while True:
            res = self("healthcheck", "run", name, check=False, timeout=120)
            if res.returncode == 0:
                return
            state = self("inspect", "--format", "{{.State.Status}}", name, check=False).stdout.strip()
            if state != "running" or time.monotonic() > deadline:
                logs = self("logs", name, check=False)
                raise AssertionError(f"{name} not healthy (state {state!r}, healthcheck {res.returncode}: "
                                     f"{res.stdout}{res.stderr})\nlogs:\n{logs.stdout[-4000:]}{logs.stderr[-4000:]}")
            time.sleep(2)

    def run_server(self, name: str, image: str, volume: str, password: str | None = None) -> int:
        """Start a server container on the volume; its TCP port on 127.0.0.1."""
        env = ["-e", f"POSTGRES_PASSWORD={password}"] if password else []
        self("run", "-d", "--name", name, "-p", "127.0.0.1::5432", *env,
             "-v", f"{volume}:/var/lib/sabre-pg/data", image)
        self.healthy(name)
        port = self("port", name, "5432/tcp").stdout.strip().rsplit(":", 1)[1]
        return int(port)


@pytest.fixture(scope="module")
def podman_image():
    """The image built by podman (--format docker) from debian:12-slim made by
    ../shared/container-base/make-base.sh when podman has none; removed at the end."""
    if not (CONTAINER_BASE / "make-base.sh").is_file():
        _unavailable(f"{CONTAINER_BASE}/make-base.sh not found (../shared/container-base beside the repository)")
    _install_podman()
    podman = Podman()
    if podman("image", "exists", BASE_IMAGE, check=False).returncode != 0:
        res = subprocess.run(["sh", str(CONTAINER_BASE / "make-base.sh")], env=podman.env, capture_output=True,
                             text=True, timeout=900)
        assert res.returncode == 0, f"make-base.sh failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    tag = f"localhost/sabre-pg-test:{secrets.token_hex(4)}"
    # --jobs 2: the runtime stage's apt-get runs while the build stage makes the wheel;
    # --layers=false: no cached layers left behind (each source change would leave ~160 MB)
    podman("build", "--format", "docker", "--pull=never", "--jobs", "2", "--layers=false",
           "-f", str(DOCKERFILE), "-t", tag, str(REPO_DIR), timeout=900)
    try:
        yield podman, tag
    finally:
        podman("rmi", "-f", tag, check=False)


@pytest.mark.podman
def test_image_runs_with_podman(podman_image):
    """Build (--format docker keeps the HEALTHCHECK), run: healthy, `sabre-pg check`, `sabre-pg demo`,
    sabre_anonymize over TCP authenticated by SCRAM, a wrong password refused, and the data kept
    in the volume by a new container."""
    podman, image = podman_image
    health = json.loads(podman("image", "inspect", "--format", "{{json .Config.Healthcheck}}", image).stdout)
    assert health and health["Test"][-2:] == ["sabre-pg", "check"], health
    suffix = secrets.token_hex(4)
    name, volume, password = f"sabre-pg-test-{suffix}", f"sabre-pg-test-{suffix}", secrets.token_urlsafe(12)
    names = [name]
    try:
        port = podman.run_server(name, image, volume, password)
        check = json.loads(podman("exec", name, "sabre-pg", "check", "--json").stdout)
        assert check["ok"] is True, check
        demo = podman("exec", name, "sabre-pg", "demo", "--rows", "3000")
        assert "census_demo" in demo.stdout + demo.stderr

        def dsn(port: int, password: str) -> str:
            return f"host=127.0.0.1 port={port} user=postgres dbname=sabre connect_timeout=20 password={password}"

        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn(port, f"wrong-{password}")).close()
        with psycopg.connect(dsn(port, password), autocommit=True) as conn:
            rules = conn.execute("SELECT DISTINCT auth_method FROM pg_catalog.pg_hba_file_rules "
                                 "WHERE type = 'host'").fetchall()
            assert rules == [("scram-sha-256",)]
            assert conn.execute("SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_catalog.pg_authid "
                                "WHERE rolname = 'postgres'").fetchone() == (True,)
            conn.execute("CREATE TABLE public.people (id integer PRIMARY KEY, age integer, sex integer, salary integer)")
            conn.execute("INSERT INTO public.people SELECT i, 20 + i % 47, i % 2, 1000 + (i * 37) % 500 "
                         "FROM pg_catalog.generate_series(1, 400) AS i")
            assert conn.execute("SELECT * FROM sabre.sabre_anonymize(source => 'public.people'::regclass, "
                                "quasi_identifiers => ARRAY['age', 'sex'], sensitive => 'salary', "
                                "t => 0.3, k => 5)").fetchall()
            classes, violations, max_emd, min_size = conn.execute(
                "SELECT * FROM sabre.sabre_verify('public.people_sabre'::regclass, 'salary', 0.3, 5)").fetchone()
            assert classes >= 1 and violations == 0 and max_emd <= 0.3 and min_size >= 5
            assert conn.execute("SELECT pg_catalog.count(*) FROM public.people_sabre").fetchone() == (400,)

        # a new container on the same volume: no POSTGRES_PASSWORD needed any more, the data is there
        podman("rm", "-f", "-t", "10", name)
        names.append(name2 := f"{name}-again")
        port = podman.run_server(name2, image, volume)
        with psycopg.connect(dsn(port, password)) as conn:
            assert conn.execute("SELECT pg_catalog.count(*) FROM public.people_sabre").fetchone() == (400,)
            assert conn.execute("SELECT pg_catalog.count(*) > 0 FROM public.census_demo").fetchone() == (True,)
    finally:
        for n in names:
            podman("rm", "-f", "-t", "5", n, check=False)
        podman("volume", "rm", "-f", volume, check=False)
