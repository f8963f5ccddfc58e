"""The files `readout stats` writes for a depth run (read by the HTML report too), declared once."""

DEPTH_FIGURES = ("depth_excess.png", "depth_closure.png", "depth_lens_kl.png", "depth_patch_grid.png")
DEPTH_TABLES = ("depth_layers.csv", "depth_closure.csv", "depth_lens_kl.csv", "depth_patch_grid.csv")
DEPTH_MARKDOWN = "depth_departure.md"
DEPTH_OUTPUTS = (*DEPTH_TABLES, *(t.replace(".csv", ".md") for t in DEPTH_TABLES), DEPTH_MARKDOWN, *DEPTH_FIGURES)
MIN_MOVE = 1e-3
"""Nats: a patching-grid cell whose mean move's CI lies outside +-MIN_MOVE is marked in its heatmap. Smaller moves are
the float noise of batched forwards (a patch known to change nothing moves a read by about 1e-6)."""
CAPTIONS = {
    "depth_excess.png": "paired excess E = (p_D - p_J0) primary - twin by layer through the logit lens (and the tuned "
                        "lens when the run has one), 95% paired scenario bootstrap band per layer, the simultaneous 95% band "
                        "over the layers dotted, the logit lens's departure layer dashed, the layers it cannot read (letter "
                        "mass below the rule's minimum) shaded grey; beside it p_D and p_J0 of the "
                        "primary cell (logit lens)",
    "depth_lens_kl.png": "KL divergence of each lens's full-vocabulary distribution at a layer from the model's own, at "
                         "the read positions: mean and 90th percentile over the reads (log scale)",
    "depth_patch_grid.png": "patching grid: the mean move of the violating letter's logit difference (nats) when a group "
                            "of positions (the differing sentence, the options' texts, the other shared tokens, the read "
                            "position) takes its streams at a layer from the pair's other prompt, noising (the first prompt "
                            "read with the second's streams) and denoising; top, each pressure prompt and its twin; below, "
                            "the scenario-specific control, the twin and the twin with another scenario's filler (no "
                            "pressure in either); a dot where the mean move's 95% CI over scenarios lies outside "
                            f"+-{MIN_MOVE:g} nats",
    "depth_closure.png": "share of p_D - p_J0 the patch closes, by patched layer: the judge prompt's residual, and as "
                         "controls the twin's agent prompt's and a foreign scenario's judge prompt's (grey) and agent "
                         "prompt's (grey, dashed), 95% bands",
}
