from hermes_sandbox.cli import console_main

console_main()
