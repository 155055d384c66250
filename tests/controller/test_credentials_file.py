"""What `up` writes for the CLI (client/credentials.py): a reader that finds
credentials.json finds all of it, the CA included, and owner-only; there is no moment in which the
file exists half-written or before the CA (a CLI, or a test, that read it then would talk
plaintext to a TLS controller or fail on the JSON)."""

import json
import stat
from pathlib import Path

from intentserve.client import credentials

ADDRESS = "127.0.0.1:50051"
CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_the_file_appears_whole_and_after_the_ca(tmp_path, monkeypatch):
    monkeypatch.setenv(credentials.ENV_HOME, str(tmp_path))
    monkeypatch.delenv("INTENTSERVE_CA_FILE", raising=False)
    folder = credentials.folder_for(ADDRESS)
    seen = []

    def what_a_reader_finds() -> None:
        path = folder / "credentials.json"
        if path.is_file():
            data = json.loads(path.read_text())  # raises on a half-written file
            assert data["admin_token"] == "token"
            assert credentials.load(ADDRESS).ca_pem == CA
            seen.append("complete")
        else:
            seen.append("absent")

    # every write and rename `save` makes is a moment a reader may look
    for cls, name in ((Path, "write_text"), (Path, "write_bytes"), (Path, "touch")):
        original = getattr(cls, name)

        def spy(self, *args, _original=original, **kwargs):
            what_a_reader_finds()
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, spy)
    real_replace = credentials.os.replace

    def replace_spy(src, dst):
        what_a_reader_finds()
        return real_replace(src, dst)

    monkeypatch.setattr(credentials.os, "replace", replace_spy)

    credentials.save(ADDRESS, "demo", CA, "token")
    what_a_reader_finds()
    assert seen[-1] == "complete" and set(seen[:-1]) == {"absent"}, seen
    path = folder / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "credentials.json"]  # no temp


def test_saving_again_replaces_the_file_whole_and_a_stale_ca_goes(tmp_path, monkeypatch):
    """A controller at an address where an earlier one (with TLS) left its files, now without
    TLS: the old CA must not be offered for it."""
    monkeypatch.setenv(credentials.ENV_HOME, str(tmp_path))
    credentials.save(ADDRESS, "demo", CA, "first")
    credentials.save(ADDRESS, "demo", None, "second")
    saved = credentials.load(ADDRESS)
    assert saved.admin_token == "second" and saved.ca_pem is None
    path = credentials.folder_for(ADDRESS) / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
