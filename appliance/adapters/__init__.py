"""Built-in adapters. Each module here registers itself through the plugin hooks exactly like a
plugin does (`@hookimpl def appliance_delivery_adapters(settings)`), and is listed in
`appliance.plugins.BUILTIN_MODULES`. Importing this package imports none of them."""
