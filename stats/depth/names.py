"""The files `readout stats` writes for a depth run (read by the HTML report too), declared once."""

DEPTH_FIGURES = ("depth_excess.png", "depth_closure.png")
DEPTH_TABLES = ("depth_layers.csv", "depth_closure.csv")
DEPTH_MARKDOWN = "depth_departure.md"
DEPTH_OUTPUTS = (*DEPTH_TABLES, "depth_layers.md", "depth_closure.md", DEPTH_MARKDOWN, *DEPTH_FIGURES)
CAPTIONS = {
    "depth_excess.png": "paired excess E = (p_D - p_J0) primary - twin by layer through the logit lens, 95% paired "
                        "scenario bootstrap band, departure layer dashed; beside it p_D and p_J0 of the primary cell",
    "depth_closure.png": "share of p_D - p_J0 the patch closes, by patched layer: the judge prompt's residual, the twin's "
                         "agent prompt's and a foreign scenario's judge prompt's (controls), 95% bands",
}
