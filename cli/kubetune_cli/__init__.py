"""kubetune."""
