"""Pure plans over attrs values: retry and backoff, schedule arithmetic, run preparation."""
