"""Analysis and control: linearization, equilibria, discrete stability, consistent initial states, LQR."""
