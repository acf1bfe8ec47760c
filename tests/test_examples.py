"""The README's public training script (pytorch/examples' word_language_model with one line of
starvewatch) runs and reports its run."""
import re

from benchmarks.word_language_model import run


def test_word_language_model_with_one_line_reports_its_run(tmp_path):
    done = run(tokens=6_000, epochs=1, workdir=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "End of training" in done.stdout  # the example ran to its end, unchanged otherwise
    # The example's own arithmetic: tokens (words + <eos> per line) / batch 20 rows, bptt 35.
    lines = (tmp_path / "data" / "train.txt").read_text().splitlines()
    rows = sum(len(l.split()) + 1 for l in lines) // 20
    line = re.search(r"^  train\s+(\d+) steps\s+wait\s+([\d.]+)%", done.stderr, re.M)
    assert line is not None, done.stderr
    assert int(line.group(1)) == len(range(0, rows - 1, 35))
    assert "starvewatch: run word_language_model (word_language_model-" in done.stderr
