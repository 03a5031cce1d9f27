"""calibrate.shipped.write_or_check: the --write / --check step of the fit and reading modules."""
from __future__ import annotations

from calibrate.shipped import write_or_check


def test_check_names_every_file_that_differs_and_write_rewrites_them(tmp_path, capsys):
    same, other, missing = tmp_path / "a.json", tmp_path / "b.yaml", tmp_path / "c.json"
    same.write_text("x\n")
    other.write_text("old\n")
    files = {same: "x\n", other: "new\n", missing: "y\n"}
    assert write_or_check(files, write=False, check=True, how="python -m calibrate.demo --write") == 1
    err = capsys.readouterr().err
    assert str(other) in err and str(missing) in err and str(same) not in err and "calibrate.demo --write" in err
    assert other.read_text() == "old\n" and not missing.exists()          # a check writes nothing
    assert write_or_check(files, write=True, check=False, how="") == 0
    assert [p.read_text() for p in files] == ["x\n", "new\n", "y\n"]
    assert write_or_check(files, write=False, check=True, how="") == 0
