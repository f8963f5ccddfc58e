"""The files `readout stats` writes for a steering run (read by the HTML report too), declared once."""

STEER_FIGURES = ("steer_strength.png", "steer_scenarios.png")
STEER_TABLES = ("steer_verdict.csv", "steer_selection.csv", "steer_grid.csv", "steer_random_band.csv",
                "steer_capability.csv", "steer_scenarios.csv")
STEER_MARKDOWN = "steer_summary.md"
STEER_OUTPUTS = (*STEER_TABLES, *(t.replace(".csv", ".md") for t in STEER_TABLES), STEER_MARKDOWN, *STEER_FIGURES)
CAPTIONS = {
    "steer_strength.png": "test part: paired excess E = (p_D - p_J0) primary - twin against steering strength, one panel "
                          "per layer, 95% paired scenario bootstrap band; grey: the 5th-95th percentile band of E over the "
                          "random directions of the same norm; dotted: the point chosen on the selection part; beside it "
                          "the twin's p_D and J0 (primary) under the same steering",
    "steer_scenarios.png": "test part, at the point each direction chose on the selection part: every test scenario's "
                           "change of E under the steering (E steered - E unsteered), sorted; red: the wrong way (E "
                           "rises); grey dots: the median change over the random directions on the same scenario; the "
                           "title gives the wrong-way share with its Wilson 95% interval",
}
