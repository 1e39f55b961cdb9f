"""The round: what one round computes, from the cohort's local training to the noised, optimized server
step (the pieces take explicit inputs and never reach back into the run loop)."""
