"""Developer tools that read the package's source; nothing in the package imports them."""
