from stevora.cli import main

main()
