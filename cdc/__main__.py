from cdc.cli import main

main()
