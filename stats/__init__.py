"""Statistics over exported run tables (numpy/scipy/statsmodels/pandas only; never imports torch)."""
