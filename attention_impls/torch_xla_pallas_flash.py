"""placeholder: implemented next."""
