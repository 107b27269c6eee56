"""The recipe as one resumable command: a small make over the steps (steps.py), the recipe's
inputs checked before the first step (inputs.py), its steps (recipe.py)."""
