"""Statistics over exported run tables (numpy/scipy/statsmodels/pandas only; never imports torch).

    stats.core  what both papers share: errors (one root), Estimate, seeding, bootstraps, contract-typed
                table reading, CSV/Markdown writing, the figure convention
    stats.gap   the judgment-action gap paper (`readout stats`, `readout compare`)
    stats.nsi   the negation paper's framing-stability audit (`readout nsi-stats`, `nsi-export`, `nsi-gold`)

Names and columns come from the table contract (`contract`), the only package of ours stats imports.
"""
