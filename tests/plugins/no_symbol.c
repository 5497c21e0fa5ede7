/* no_symbol.c - a shared object that is not a sekali handler: must be refused. */
int not_a_handler(void);
int not_a_handler(void)
{
    return 42;
}
