"""The model layer: systems, the terms of their equations of motion, the controllers they
read their inputs from and their consistent states."""
