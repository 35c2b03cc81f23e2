"""The model layer: systems and the terms of their equations of motion."""
