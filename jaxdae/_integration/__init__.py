"""Simulation: the solve, its adjoint, solvers and the actuated solve."""
