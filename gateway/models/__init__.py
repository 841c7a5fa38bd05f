"""The shapes of what crosses the API, and the vocabulary everything shares (the bottom layer)."""
