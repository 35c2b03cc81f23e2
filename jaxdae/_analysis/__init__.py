"""Analysis and control: linearization, equilibria, discrete stability, LQR, consistent states of
actuated systems."""
