"""The command line as a user meets it: help, version, one-line errors."""
import subprocess
import sys


def mmscope(*args):
    return subprocess.run([sys.executable, "-m", "mmscope.cli", *args],
                          capture_output=True, text=True)


def test_help_lists_each_existing_command_with_description():
    from mmscope.cli import COMMANDS, _available

    out = mmscope("--help")
    assert out.returncode == 0
    assert "tiny-model" in out.stdout
    for name, (_, help_) in _available().items():
        assert name in out.stdout and help_ in out.stdout
    assert set(_available()) <= set(COMMANDS)


def test_no_command_prints_help_and_fails():
    out = mmscope()
    assert out.returncode == 2 and "COMMAND" in out.stdout


def test_tiny_model_into_a_file_is_a_one_line_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    out = mmscope("tiny-model", str(f))
    assert out.returncode == 2
    assert out.stderr.strip() == f"mmscope: error: {f} exists and is not a directory"
