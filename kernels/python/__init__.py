"""Code that runs inside the Python kernel (ipykernel)."""
