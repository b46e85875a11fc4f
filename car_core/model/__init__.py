"""What a run is: steps, actions, interventions, outcomes, noise, budgets."""
