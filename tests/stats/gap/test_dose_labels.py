"""The dose arm's readings the paper names without defining (the ratio reading P1-A14, the rider's agreement
P1-A6) are labelled as the project's own where a reader meets them: the estimates' notes and report.md."""

from stats.gap import analyze, run_report


def test_ratio_and_rider_rows_say_their_definition_is_ours(dose_run):
    a = analyze(dose_run, n_boot=100)
    for q in ("reasoning / filler", "rider agreement (2048 vs 512)"):
        e = a.get("dose", q, "primary")
        assert e.value is not None and "ours" in (e.note or ""), (q, e.note)
    run_report(dose_run, seed=0, n_boot=100)
    text = (dose_run / "stats" / "report.md").read_text()
    section = text[text.index("Dose arm (Table 8"):]
    assert "ratio reading" in section and "rider agreement" in section and "defines neither" in section
